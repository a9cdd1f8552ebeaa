"""The calls of a :class:`~celery_semaphore.Semaphore` that look after its state rather than
acquire or release: maintenance (reclaim, sweep, boot marker), the runtime overrides, throttling,
and inspection."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from . import _validate, wire
from .base import SemaphoreBase
from .info import HolderInfo, Snapshot, ThrottleResult, WaiterInfo
from .rates import Rate, encode_rates, parse_rates

__all__ = ["SemaphoreControls"]


class SemaphoreControls(SemaphoreBase):
    """Maintenance, overrides, throttling and inspection of a semaphore (part of
    :class:`~celery_semaphore.Semaphore`)."""

    def release_reason(self, token: str) -> str | None:
        """Why permit ``token`` was released by someone other than its holder (the
        ``reason`` given to :meth:`release_token`), or None: nobody said (its lease expired
        and was reclaimed, or it was released without a reason)."""
        raw = self._call(lambda: self.client.get(self.keys.gone(token)))
        return None if raw is None else wire.text(raw)

    def reclaim(self) -> int:
        """Take back expired leases and places now (normally done by every operation), and
        wake whoever the freed units belong to.  Returns the number of holders reclaimed."""
        reclaimed, wakes = wire.status_reply(
            self._run("reclaim", wire.reclaim_args(self.limit, self._aging_ms))
        )
        self._wake(wakes)
        return reclaimed

    def sweep(self) -> tuple[int, str, int]:
        """:meth:`reclaim` and :meth:`boot_marker` in one round trip, as a heartbeat does
        about once a second for each semaphore its process uses: ``(holders reclaimed,
        marker, fence)``."""
        expired, died, marker, fence = self.sweep_by_reason()
        return expired + died, marker, fence

    def sweep_by_reason(self) -> tuple[int, int, str, int]:
        """:meth:`sweep`, with the holders reclaimed told apart: ``(leases expired, holders of
        processes whose liveness record expired, marker, fence)``."""
        args = wire.sweep_args(self.limit, self._aging_ms, self.new_ticket())
        (reclaimed, died, marker, fence), wakes = wire.sweep_reply(self._run("sweep", args))
        self._wake(wakes)
        return reclaimed - died, died, marker, fence

    def boot_marker(self) -> tuple[bool, str, int]:
        """The marker of this semaphore's state in Redis: ``(created, marker, fence)``.

        The first call on a fresh state writes a random marker into the state hash; later
        calls read it.  A caller that has seen one marker and later finds another (or had
        to create one) knows that the state was lost meanwhile: Redis restarted without
        persistence, failed over to a replica that lacked it, or the keys were flushed.
        ``fence`` is the last fencing token granted (it only grows while the state lives).
        """
        fresh = self.new_ticket()

        def call() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            pipe.hsetnx(self.keys.state, "boot", fresh)
            pipe.hmget(self.keys.state, "boot", "fence")
            return list(pipe.execute())

        created, (marker, fence) = self._call(call)
        return bool(created), wire.text(marker), int(fence or 0)

    def set_limit_override(self, limit: int | None) -> None:
        """Store a runtime limit in Redis that every client of this semaphore obeys (None
        clears it).  Lowering it revokes nothing: new grants wait until enough is released."""
        if limit is None:
            self._call(lambda: self.client.hdel(self.keys.state, "limit_override"))
            self.reclaim()
            return
        value = _validate.positive_int("limit", limit)
        self._call(lambda: self.client.hset(self.keys.state, "limit_override", value))
        self.reclaim()

    def set_rate_override(
        self, rate: str | Rate | Sequence[str | Rate] | None
    ) -> tuple[Rate, ...] | None:
        """Store runtime rate windows in Redis that every client of this semaphore obeys in
        place of the ``rate=`` its acquirers send (None clears the override, and only it:
        the next acquire stores its own ``rate=`` again, or none).  Takes what ``rate=``
        takes; returns the parsed windows (None when cleared).  A waiter heavier than the
        override's smallest count cannot start until the override is raised or cleared."""
        rates = parse_rates("rate", rate)
        if not rates:
            # only an override is removed (acquires never write one, so nothing else can
            # replace it between these two calls); an acquirer's rate stays
            stored = self._call(lambda: self.client.hget(self.keys.state, "rate"))
            if stored is not None and wire.text(stored).startswith("="):
                self._call(lambda: self.client.hdel(self.keys.state, "rate"))
            self.reclaim()
            return None
        text = "=" + encode_rates(rates)
        self._call(lambda: self.client.hset(self.keys.state, "rate", text))
        self.reclaim()
        return rates

    def clear_throttle(self) -> bool:
        """End a throttle pause and forget an adaptive limit now, for every client (an
        operator's reset: the configured limit, or ``limit_override``, is in force again), and
        wake the waiters the free units belong to.  True when there was something to clear.
        :attr:`Snapshot.throttles_total` is kept."""
        removed = self._call(lambda: self.client.hdel(self.keys.state, "aimd"))
        self.reclaim()
        return bool(removed)

    def throttled(
        self, retry_after: float | None = None, *, fencing_token: int | None = None
    ) -> ThrottleResult:
        """The downstream service refused a call (429, 503): tell every client of this
        semaphore, in one round trip.

        * ``retry_after`` (seconds, e.g. the response's Retry-After): nobody starts until
          that long from now, on the Redis server's clock (a longer pause already set is
          kept); waiters keep their places and wake by themselves when it ends.
        * With ``adaptive=True``: the limit now in force is halved (floor, at least 1),
          once per congestion episode: not again for a call granted before the last
          decrease (``fencing_token``, as :meth:`Permit.throttled` passes it), nor, without
          a fencing token, within max(``retry_after``, 1 s, the hold-time average) of it.

        Every call counts in :attr:`Snapshot.throttles_total`.
        """
        pause = _validate.optional_non_negative_seconds("retry_after", retry_after)
        fence = 0
        if fencing_token is not None:
            fence = _validate.positive_int("fencing_token", fencing_token)
        retry_ms = 0 if pause is None else math.ceil(pause * 1000)
        args = wire.throttle_args(self.limit, retry_ms, self.adaptive, fence, self._aging_ms)
        result, wakes = wire.throttle_reply(self._run("throttle", args))
        self._wake(wakes)
        return result

    def inspect(self) -> Snapshot:
        """Holders (with their process's liveness), waiters and counts, read in one round
        trip on the server's clock."""
        return wire.snapshot(self.name, self.limit, self._run("inspect", [], self._read_keys()))

    def available(self) -> int:
        """Units free right now (waiters in line may already be entitled to them)."""
        return self.inspect().available

    def holders(self) -> list[HolderInfo]:
        return self.inspect().holders

    def waiters(self) -> list[WaiterInfo]:
        return self.inspect().waiters
