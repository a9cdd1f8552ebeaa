"""The gate thread: it pops the wake-ups and handoffs releases push onto the gate's two wake
lists, tries again the held tasks whose rate window opened, and runs the maintenance pass
(:mod:`.upkeep`) once per :data:`.timing.TICK`, Redis answering or not."""

from __future__ import annotations

import threading
from typing import Any

from redis.exceptions import RedisError

from ... import logs
from ...core import clock
from .. import config, wakes
from ..clients import client_for
from . import timing
from .upkeep import Upkeep

log = logs.get("gate")


class GateThread:
    """Runs the gate thread (see the module's docstring)."""

    def __init__(
        self, app: Any, key: str, handoff_key: str, upkeep: Upkeep, stop: threading.Event
    ) -> None:
        self.app = app
        self.key = key
        self.handoff_key = handoff_key
        self.upkeep = upkeep
        self.attempts = upkeep.attempts
        self.registry = upkeep.registry
        self.health = upkeep.health
        self._stop = stop
        self._blmpop = True  # until the server says it has no BLMPOP (before Redis 7)
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="celery-semaphore-gate", daemon=True)
        self.thread.start()

    def interrupt(self) -> None:
        """End the gate thread's blocking pop now rather than at its tick: an empty item on
        its own list (read as a wake-up for no ticket), so the worker stops up to a tick
        sooner.  Best effort: without it the pop still ends within ``TICK``."""
        try:
            wakes.push(self.app, self.key, "")
        except Exception as exc:  # Redis down, or no client: the tick ends the wait
            log.debug("could not interrupt the gate's wait: %s", exc, semaphore=None, task_id=None)

    def _run(self) -> None:
        next_tick = clock.monotonic() + timing.TICK
        client: Any = None
        health = self.health
        while not self._stop.is_set():
            items: list[str] = []
            try:
                if client is None:
                    client = self._client()
                now = clock.monotonic()
                retry = self.registry.next_retry()
                wait = max(0.01, min(timing.TICK, next_tick - now, retry - now))
                items = self._take_wakes(client, wait)
                health.outage.ok()
            except Exception as exc:
                # Redis failing: no wake-ups, but the tick still runs (revoked tasks go, those
                # past max_wait time out, those held too long park), without Redis calls
                health.carry_on(exc)
                client = None
                self._stop.wait(0.5)
            try:
                self._deliver(items)
                if health.ok():  # while Redis fails, the tick alone acts (no calls)
                    self._retry_due()
                if clock.monotonic() >= next_tick:
                    self.upkeep.tick()
                    next_tick = clock.monotonic() + timing.TICK
            except Exception as exc:  # never let the gate die: held tasks depend on it
                health.carry_on(exc)
                self._stop.wait(0.5)

    def _deliver(self, items: list[str]) -> None:
        """Act on the items taken from the wake lists: handoffs and wake-ups."""
        for item in items:
            found = wakes.parse(item)
            if isinstance(found, wakes.Handoff):
                self.attempts.handed(found.ticket, found.fence, found.expires_at, found.claim)
            elif isinstance(found, wakes.Wake):
                self.attempts.wake(found.ticket)

    def _retry_due(self) -> None:
        """Try again the held tasks whose time came: no release wakes a task held by a rate
        window, so the gate does when the window opens (the script said when)."""
        for entry in self.registry.take_due(clock.monotonic()):
            self.attempts.wake(entry.ticket)

    def _client(self) -> Any:
        return client_for(config.redis_url_for(self.app.conf), self.app.conf)

    def _take_wakes(self, client: Any, wait: float) -> list[str]:
        """Wake-ups and handoffs from the gate's two lists (plain tickets, or
        ``+<fence> <expiry ms> <ticket>``), a batch of one list at a time."""
        tickets: list[Any] = []
        keys = (self.handoff_key, self.key)
        if self._blmpop:
            # Redis 7: one round trip takes the whole batch
            try:
                found = client.blmpop(
                    wait, len(keys), *keys, direction="LEFT", count=timing.WAKE_BATCH
                )
            except RedisError as exc:
                if not _no_such_command(exc):
                    raise
                self._blmpop = False  # Redis 6: BLPOP, then LPOP the rest
            else:
                tickets = list(found[1]) if found else []
        if not self._blmpop:
            first = client.blpop(list(keys), timeout=wait)
            if first is None:
                return []
            tickets = [first[1]]
            more = client.lpop(first[0], timing.WAKE_BATCH)
            if more:
                tickets.extend(more)
        return [t.decode() if isinstance(t, bytes) else str(t) for t in tickets]


def _no_such_command(exc: Exception) -> bool:
    """The server (Redis 6: "unknown command") or redis-py's cluster client, which checks its
    node's command table first ("... doesn't exist in Redis commands"), has no such command."""
    text = str(exc).lower()
    return "unknown command" in text or "doesn't exist in redis commands" in text
