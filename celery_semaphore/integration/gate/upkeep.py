"""The gate thread's maintenance pass, once per :data:`.timing.TICK`: held places kept alive
(and lost wake-ups repaired), revoked tasks dropped, those past ``semaphore_max_wait`` failed,
those held too long parked, standbys sent ahead or cancelled, readiness adjusted, and the
leases of grants the pool has not started yet refreshed."""

from __future__ import annotations

import time
from typing import Any

from ... import logs
from ...core import clock
from ...core.exceptions import SemaphoreError
from .. import config
from ..delivery import Directive, Stage
from ..locks import quarantined
from . import giveback, reqs, timing
from .entry import Entry
from .ready import Readying

log = logs.get("gate")
log_wait = logs.get("wait")


class Upkeep:
    """What the gate thread does at each tick (see :meth:`tick`)."""

    def __init__(self, app: Any, readying: Readying) -> None:
        self.readying = readying
        self.attempts = readying.attempts
        self.ahead = self.attempts.ahead
        self.to_pool = readying.to_pool
        self.registry = readying.registry
        self.health = self.attempts.health
        self.consumer = readying.consumer
        self._vt = config.visibility_timeout(app.conf)

    def tick(self) -> None:
        now = clock.monotonic()
        health, registry = self.health, self.registry
        with registry.lock:
            held = [e for e in registry.held_entries() if not e.busy]
            pending = registry.pending_entries()
            registry.standing.expire()
            standing = [registry.left_entry(t) for t in registry.standing.tickets()]
        for found in standing:
            if found is not None:
                self.ahead.cancel_if_revoked(found)
        for name in sorted({e.sem.name for e in held}):
            self.ahead.stand_by(name)
        if health.ok():
            self.readying.unready_surplus()
        self.readying.queue_starved(now)
        # While Redis fails (a call failed since the last tick ended), a tick makes no Redis
        # calls: each would wait out its retries, and the tick's local decisions with them.
        # The next tick starts after the entry whose call failed, so one that always fails
        # (its Redis Cluster node is down) does not keep those behind it from their turn.
        for entry in _after(held, health.failed_on):
            redis_ok = health.ok()
            self._maintain(entry, now, redis_ok)
            if redis_ok and not health.ok():
                health.failed_on = entry.ticket
        for entry in pending:
            if health.ok():
                self._maintain_pending(entry, now)
        health.tick_ended = clock.monotonic()

    def _maintain(self, entry: Entry, now: float, redis_ok: bool) -> None:
        req = entry.req
        waited = time.time() - (entry.state.first_wait or time.time())
        max_wait = entry.opts.max_wait
        if reqs.gone(req):
            self.leave(entry, None, "revoked", withdraw=redis_ok)
        elif max_wait is not None and waited >= max_wait:
            directive = self.to_pool.directive(entry, "timeout", waited=waited)
            self.leave(entry, directive, "timed out", withdraw=redis_ok)
        elif now - entry.since >= self.max_hold():
            self._park_held(entry, now, redis_ok)
        elif not redis_ok:
            return
        elif (
            now - entry.refreshed >= entry.place_ttl / 3
            or not (entry.counted and entry.stage is Stage.HELD)
        ) and self.registry.claim(entry):
            # keep the place alive (and claim units whose wake-up was lost); an uncounted
            # entry (over semaphore_worker_hold, or Redis failed), or one whose first attempt
            # failed, retries every tick
            self.attempts.attempt(entry)

    def _park_held(self, entry: Entry, now: float, redis_ok: bool) -> None:
        """Held too long: send it to the pool to park (keeping its place in line).

        First one more try, with a plain wake-up address in place of the handoff one.  From
        then on a release only names this ticket (the wrapper that parks it claims the units).
        A handoff made before this try is found by it: the task then runs with that grant.
        One made later (Redis failed at this try) is the wrapper's own: it parks under this
        delivery's claim, which the gate hands over with the place.  While Redis fails
        (or the state is in quarantine) it stays held, tried again at the next tick, up to
        :data:`.timing.PARK_ANYWAY` times the longest hold: then it parks regardless (its
        wrapper parks on the countdown alone), before the broker would deliver the message
        again."""
        answered = False
        if redis_ok:
            if not self.registry.claim(entry):
                return
            entry.wake_data = "@" + self.to_pool.key
            asked = entry.refreshed  # set again only when Redis answers
            self.attempts.attempt(entry)
            answered = entry.refreshed != asked and not quarantined(entry.sem)
        if answered or now - entry.since >= timing.PARK_ANYWAY * self.max_hold():
            self.leave(entry, self.to_pool.directive(entry, "park"), "held too long")

    def leave(
        self, entry: Entry, directive: Directive | None, why: str, withdraw: bool = True
    ) -> None:
        """Stop holding ``entry``: drop it (revoked) or send it to the pool with a directive
        (``timeout``: fail with SemaphoreTimeout; ``park``: re-publish with a countdown).
        ``withdraw=False`` (Redis failing): a place it gives up is left to expire."""
        if directive is None:
            stage = Stage.REVOKED
        elif directive.do == "timeout":
            stage = Stage.TIMED_OUT
        else:  # park: with its place and claim
            stage = Stage.HANDED_OVER
        if not self.registry.leave(entry, stage):
            return
        if entry.stage is not Stage.HANDED_OVER and withdraw:
            giveback.withdraw(entry, why, self.health)
        log_wait.info(
            "task %s: %s after %.1fs held",
            entry.req.name,
            why,
            clock.monotonic() - entry.since,
            semaphore=entry.sem.name,
            task_id=entry.req.id,
        )
        if directive is None:
            self.consumer.call_soon(entry.req.revoked)
        else:
            self.consumer.call_soon(self.to_pool.dispatch, entry, directive)

    def _maintain_pending(self, entry: Entry, now: float) -> None:
        """A grant handed to the pool: keep its lease alive until the body starts and its own
        heartbeat takes over; forget it once the request is done (until then, on prefork, the
        arrivals thread watches the child running it)."""

        req = entry.req
        if entry.dispatched and not reqs.in_pool(req):
            self.registry.forget_pending(entry)
            return
        if req.time_start is not None:
            return
        if now - entry.granted_at >= entry.opts.heartbeat_interval:
            entry.granted_at = now
            try:
                entry.sem.refresh_token(entry.ticket, holder_only=True, claim=entry.claim)
            except SemaphoreError as exc:
                self.health.failed()
                log.warning(
                    "refresh of a pending grant failed: %s",
                    exc,
                    semaphore=entry.sem.name,
                    task_id=entry.req.id,
                )

    def max_hold(self) -> float:
        return timing.MAX_HOLD if self._vt is None else min(timing.MAX_HOLD, self._vt / 2)


def _after(entries: list[Entry], ticket: str | None) -> list[Entry]:
    """``entries`` starting after the one holding ``ticket`` (all of them, in order, when
    none does)."""
    for i, entry in enumerate(entries):
        if entry.ticket == ticket:
            return entries[i + 1 :] + entries[: i + 1]
    return entries
