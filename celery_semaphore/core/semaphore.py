"""A named, counting, fair, weighted, lease-based semaphore in Redis.

This is the core primitive; it never imports Celery and can be used on its own::

    from celery_semaphore import Semaphore

    sem = Semaphore("payment-gateway", limit=5, redis="redis://localhost:6379/0")
    with sem.hold(timeout=10) as permit:           # or: with sem: ...
        call_gateway(fencing_token=permit.fencing_token)

How it works, in one paragraph: every state change (acquire, release, refresh, withdraw,
reclaim) is one Lua script, so one round trip, atomic, and timed by the Redis server's clock.
Holders are leases: a holder that stops refreshing loses its units when its lease runs out.
Waiters stand in one FIFO line; free units belong to the oldest live waiters that fit, so a
newcomer never barges past them.  A waiter keeps its place only while it keeps calling (its
place has a TTL), so a vanished waiter never blocks the line for long.  When units free up, the
script that freed them names the waiters they now belong to, and the caller wakes exactly those
(a push onto each waiter's own list, on which it blocks), so there is neither polling nor a
thundering herd.

Tickets: a waiter is identified by a ticket.  ``acquire`` makes one up, or takes yours, so a
caller that comes back later (a Celery task re-delivered after a back-off) keeps its place.
A granted permit's token is its ticket.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import _validate, clock, waiting, wire
from .base import DEFAULT_AGING as DEFAULT_AGING
from .base import DEFAULT_POLL_INTERVAL as DEFAULT_POLL_INTERVAL
from .base import DEFAULT_URL as DEFAULT_URL
from .base import GONE_TTL as GONE_TTL
from .base import HANDOFF_MARK as HANDOFF_MARK
from .base import HandoffHandler as HandoffHandler
from .base import WakeHandler as WakeHandler
from .exceptions import SemaphoreFull, SemaphoreTimeout
from .info import HolderInfo, PartitionInfo, RateWindowInfo, Snapshot, ThrottleResult, WaiterInfo
from .permit import DEFAULT_TOMBSTONE_TTL as DEFAULT_TOMBSTONE_TTL
from .permit import Attempt, AttemptStatus, Permit
from .request import (
    AcquireRequest,
    AttemptOptions,
    QueueOptions,
    check_partition,
    check_queue,
    done_mode,
    make_request,
)
from .tokens import SemaphoreTokens
from .waiting import Waiter

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "HANDOFF_MARK",
    "AcquireRequest",
    "Attempt",
    "AttemptStatus",
    "HandoffHandler",
    "HolderInfo",
    "PartitionInfo",
    "Permit",
    "RateWindowInfo",
    "Semaphore",
    "Snapshot",
    "ThrottleResult",
    "WaiterInfo",
]


class Semaphore(SemaphoreTokens):
    """A named, fair, weighted, lease-based counting semaphore in Redis.

    :param name: any non-empty string; it is encoded into the keys (see :mod:`.keys`).
    :param limit: how many units may be held at once (a runtime override in Redis wins).
    :param redis: a ``redis.Redis`` / ``redis.RedisCluster`` client, or a ``redis://``,
        ``rediss://`` or ``unix://`` URL (the client is then created lazily, so a Semaphore
        made before ``fork()`` is safe to use after it).
    :param lease_ttl: seconds a grant lasts unless refreshed.
    :param key_prefix: the first part of every key.
    :param timeout: default timeout for ``with sem:`` (None waits forever).
    :param poll_interval: how often a blocked waiter re-checks if no wake-up comes.
    :param on_wake: called as ``on_wake(ticket, data)`` for parked waiters (those that gave wake
        data) that units were freed for; blocked waiters are woken without it.
    :param on_handoff: with ``on_wake``: this semaphore's releases grant the freed units
        straight to the parked waiters that take handoffs (wake data ending with
        :data:`~celery_semaphore.core.semaphore.HANDOFF_MARK`, and ``owner["claim"]``: the claim
        of the grant; its lease is ``owner["lease_ms"]`` if that is a number of ms, else
        ``lease_ttl``) and call ``on_handoff(ticket, data, fencing_token, lease_expires_at,
        claim)`` for each (expiry in server epoch seconds; ``claim``: the one the grant was made
        under, which only the waiter and the script know), instead of ``on_wake``.  The
        receiver owns that permit: it starts the work or releases it.  Without it, such
        waiters are named through ``on_wake`` and claim their units with :meth:`try_acquire`
        like any other.
    :param hash_tag: put this semaphore's keys in the Redis Cluster slot of ``{hash_tag}``
        instead of one of its own (the name is still part of every key).  Semaphores used
        together in a :class:`~celery_semaphore.SemaphoreGroup` on a Redis Cluster must share
        one hash tag.
    :param aging: seconds after which a waiter at the head of its partition's line that does
        not fit in the free units has them reserved for it, so later arrivals in other
        partitions stop overtaking it (see "Fair sharing" in the docs).  0 reserves at once.
    :param rate: at most so many starts (grants) per period, on top of ``limit``: one
        ``"N/period"`` string (period ``s``, ``m``, ``h`` or ``d``, e.g. ``"100/s"``), a
        :class:`~celery_semaphore.Rate`, or a list of them (every window must have room).
        A grant of ``weight`` units counts as ``weight`` starts; a release gives none back.
        Checked in the same script as the units, on the server's clock (see "Rates" in the
        docs); stored in Redis by each acquire, so the last acquirer's rate is the one in
        force for everyone (give all clients of one semaphore the same).  A runtime rate
        override (:meth:`set_rate_override`) wins over it.
    :param adaptive: let :meth:`throttled` lower the limit (halve it, once per congestion
        episode) and successful releases raise it again by one per limit's worth of units
        (AIMD; see "Adaptive limits" in the docs).  The lowered limit is kept in Redis and
        obeyed by every client of the semaphore, adaptive or not.  Without it,
        :meth:`throttled` only pauses new grants (``retry_after``) and counts.
    :param priority_step: seconds one step of ``priority`` moves a new place forward in its
        line (see :meth:`try_acquire`): a waiter is never passed by a later arrival that came
        more than ``9 * priority_step`` after it.  0 turns priority off.
    :param liveness_ttl: seconds this process's liveness record lives unrefreshed (None or 0:
        off, the lease alone).  The process then keeps one record in Redis, refreshed by one
        thread every third of it, and a permit whose process's record has expired (the
        process died) is free for the next script that runs for the name (see "Liveness" in
        the docs).  Ignored on a Redis Cluster.
    """

    # -- the low-level API (for integrations) -----------------------------------------------

    def try_acquire(self, ticket: str, **options: Unpack[AttemptOptions]) -> Attempt:
        """One atomic attempt, in one round trip.  Never blocks.

        :param ticket: the waiter's identity; keep it to keep your place (see the module doc).
        :param weight: units wanted (default 1).
        :param owner: free-form metadata stored with the permit (default: host and pid).
        :param lease_ttl: the grant's lease in seconds (default: the semaphore's).
        :param place_ttl: seconds the place in line is kept if not granted (0: no place).
        :param claim: tells copies of one ticket apart; a grant is returned again only to the
            same claim (so a re-sent call is idempotent, and a duplicate copy is refused).
        :param wake_data: non-empty marks the waiter as parked: when units are freed for it,
            whoever freed them gets ``on_wake(ticket, wake_data)``.
        :param wake_grace: a waiter is named in wake-ups at most once per this many seconds.
        :param epoch: a call with an epoch lower than the place's is refused as STALE.
        :param check_done: report DONE for a ticket released within its tombstone time (and
            drop the ticket's place, if it has one: that execution is over).
        :param new_execution: this call starts a new execution of a ticket used before (a task
            id sent again): forget that it was released, so the new execution's own later
            ``check_done`` calls are not answered DONE.  Not with ``check_done``.
        :param partition: the line to wait in ("" is the default one); free units are shared
            fairly among partitions with waiters (see "Fair sharing" in the docs).
        :param partition_cap: the partition never holds more than this many units (None: no
            cap); stored with the partition, the last acquirer's value counts.
        :param partition_weight: 1 to 1000: the partition's share is proportional to it;
            stored like ``partition_cap``.
        :param ready: False takes (or keeps) the place in line, in its turn, but is never
            granted while so (WAITING, or NOT_QUEUED with ``place_ttl=0``): later waiters that
            are ready pass it, and it is never named in wake-ups.  A later call with
            ``ready=True`` finds its place, and its turn, where it was.  For a caller that
            cannot use a grant right now (a worker with no free slot for the task).
        :param priority: 0-9, higher served earlier: a new place stands in its partition's
            line as if it came ``priority * priority_step`` seconds earlier (see "Priority"
            in the docs); a ticket that keeps its place keeps its priority.
        :param max_waiting: a new place is taken only while fewer than this many wait in its
            partition's line (None: no bound, 0: never wait): else FULL, checked and taken in
            one atomic step.  ``keep_newest=True``: the front waiters of that line lose their
            places instead (woken; their next call is DROPPED).
        """
        request = make_request(ticket, options)
        self._check(request)
        return self._attempt(request)

    def _check(self, request: AcquireRequest) -> None:
        """Check every value of ``request`` (the first bad one raises)."""
        _validate.ticket("ticket", request.ticket)
        weight = _validate.positive_int("weight", request.weight, maximum=self.limit)
        self._check_rate_weight(weight)
        request.check_times()
        check_partition(weight, request.partition, request.partition_cap, request.partition_weight)
        done_mode(request.check_done, request.new_execution)

    def _attempt(self, request: AcquireRequest) -> Attempt:
        """:meth:`try_acquire` of a checked ``request``: one script call."""
        args = wire.acquire_args(
            request, self.limit, self.lease_ttl, self._aging_ms, self._rate_text, self._step_ms
        )
        if self._scripts is None:
            self._load_scripts()  # (sets the liveness argument)
        args.append(self._live_arg)
        reply = self._run("acquire", args)
        attempt, wakes, error = wire.attempt(self, request, reply)
        if wire.lapsed(reply):
            self._lapsed(wire.lapsed(reply))
        if wakes:
            self._wake(wakes)
        if error is not None:
            raise error
        return attempt

    # -- the public API ---------------------------------------------------------------------

    def acquire(
        self,
        *,
        weight: int = 1,
        blocking: bool = True,
        timeout: float | None = None,
        ticket: str | None = None,
        owner: Mapping[str, Any] | None = None,
        place_ttl: float | None = None,
        **options: Unpack[QueueOptions],
    ) -> Permit | None:
        """Acquire ``weight`` units.

        Returns a :class:`Permit`, or None when ``blocking=False`` finds no room or when
        ``timeout`` seconds pass.  While blocked the caller holds a place in line and is woken
        by the release that frees its units.

        :param ticket: keep your place across calls: when given and the call returns None,
            the place is kept for ``place_ttl`` seconds (default: ``lease_ttl``).  Without a
            ticket, a failed call leaves no trace.
        :param owner: free-form metadata stored with the permit (default: host and pid).
        :param options: ``partition``, ``partition_cap``, ``partition_weight``, ``priority``,
            ``max_waiting``, ``keep_newest``: see :meth:`try_acquire`; a blocking call refused
            FULL or DROPPED raises :class:`~celery_semaphore.SemaphoreFull`.
        """
        _validate.positive_int("weight", weight, maximum=self.limit)
        if options:
            check_queue(weight, options)
        self._check_rate_weight(weight)
        wait = _validate.optional_non_negative_seconds("timeout", timeout)
        own_ticket = ticket is None
        t = self.new_ticket() if ticket is None else _validate.ticket("ticket", ticket)
        kept = self.lease_ttl if place_ttl is None else place_ttl
        if not blocking:
            # try_acquire's other checks are done above (or hold for its defaults); the
            # request is made positionally: this is the hot path of a non-blocking acquire
            place = 0.0 if own_ticket else _validate.non_negative_seconds("place_ttl", kept)
            request = AcquireRequest(
                t, weight, owner, place, "", "", 1.0, 0, False, False, None, **options
            )  # fmt: skip
            return self._attempt(request).permit
        attempt = self.wait(
            t,
            timeout=wait,
            place_ttl=max(self._blocking_place_ttl(), 0.0 if own_ticket else kept),
            keep_place=None if own_ticket else kept,
            weight=weight,
            owner=owner,
            **options,
        )
        if attempt.status in (AttemptStatus.FULL, AttemptStatus.DROPPED):
            raise self._full(attempt, t)
        return attempt.permit

    def _full(self, attempt: Attempt, ticket: str) -> SemaphoreFull:
        dropped = attempt.status is AttemptStatus.DROPPED
        why = (
            "its place in line was taken by a newer waiter (keep_newest)"
            if dropped
            else "its line is full (max_waiting)"
        )
        return SemaphoreFull(
            f"semaphore {self.name!r} (limit {self.limit}): not acquired: {why}",
            name=self.name,
            limit=self.limit,
            token=ticket,
            dropped=dropped,
        )

    def wait(
        self,
        ticket: str,
        *,
        timeout: float | None,
        place_ttl: float,
        keep_place: float | None = None,
        give_up: Callable[[], bool] | None = None,
        check_every: float = 0.1,
        **attempt_options: Any,
    ) -> Attempt:
        """Block until ``ticket`` is granted, stops waiting (any status but WAITING), or
        ``timeout`` seconds pass; return the last :class:`Attempt`.

        Between attempts it blocks on the ticket's own wake list, so the release that frees
        its units wakes it at once; it re-checks every ``poll_interval`` in case a wake-up was
        lost.  ``give_up``, when given, is called about every ``check_every`` seconds while
        blocked; the wait ends (still WAITING) when it returns True.  ``attempt_options`` go
        to :meth:`try_acquire` unchanged.  When the wait ends without a grant, the place is
        withdrawn, or with ``keep_place`` kept for that many seconds more.
        """
        ticket = _validate.ticket("ticket", ticket)
        waiter = Waiter(
            self,
            self.try_acquire,
            [self.keys.wake(ticket)],
            self.poll_interval,
            f"semaphore {self.name!r}",
            self.name,
            self.name,
        )
        return waiting.wait(
            waiter,
            ticket,
            timeout=timeout,
            place_ttl=place_ttl,
            keep_place=keep_place,
            give_up=give_up,
            check_every=check_every,
            options=attempt_options,
        )

    @contextmanager
    def hold(
        self,
        *,
        weight: int = 1,
        timeout: float | None = None,
        **options: Unpack[QueueOptions],
    ) -> Iterator[Permit]:
        """``with sem.hold(timeout=5) as permit:``: acquire or raise
        :class:`~celery_semaphore.SemaphoreTimeout` (or :class:`~celery_semaphore.SemaphoreFull`);
        release on exit.  ``options``: as :meth:`acquire`'s."""
        started = clock.monotonic()
        permit = self.acquire(weight=weight, timeout=timeout, **options)
        if permit is None:
            waited = clock.monotonic() - started
            raise SemaphoreTimeout(
                f"semaphore {self.name!r} (limit {self.limit}): no permit within "
                f"{waited:.3f}s (timeout={timeout})",
                name=self.name,
                limit=self.limit,
                waited=waited,
            )
        with permit:
            yield permit

    def __enter__(self) -> Permit:
        stack: list[Any] = self._local.__dict__.setdefault("stack", [])
        cm = self.hold(timeout=self.timeout)
        permit = cm.__enter__()
        stack.append(cm)
        return permit

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        cm = self._local.__dict__["stack"].pop()
        cm.__exit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        rate = f" rate={[str(r) for r in self.rates]}" if self.rates else ""
        adaptive = " adaptive" if self.adaptive else ""
        return (
            f"<Semaphore {self.name!r} limit={self.limit}{rate}{adaptive} "
            f"prefix={self.key_prefix!r}>"
        )
