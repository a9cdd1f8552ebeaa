"""Several semaphores at once, all or nothing: :class:`SemaphoreGroup`.

::

    gpu = Semaphore("gpu", 4, redis=client)
    licence = Semaphore("licence", 2, redis=client)
    with SemaphoreGroup([(gpu, 1), (licence, 1)]).hold(timeout=30) as permit:
        render()

Every operation is one Lua script over all the members' keys: a group acquire grants a permit
in every member or in none, and while it is not granted the ticket keeps a place in every
member's line (added by that one script, so two group waiters of one partition stand in the
same order in every line they share).  It is granted once the free units of every member are
its by the usual rule (FIFO within a partition, fair shares across partitions); until then it
holds nothing, so it blocks nobody's permits, only (like any waiter) the units promised to it.

On Redis Cluster one script may only touch keys of one slot: the members must share one
``hash_tag`` (see :class:`~celery_semaphore.Semaphore`).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

import redis as redis_lib
from redis.exceptions import RedisError, ResponseError

from . import _validate, clock, waiting, wire
from ._scripts import ScriptSet
from .exceptions import SemaphoreBackendError, SemaphoreError, SemaphoreTimeout
from .permit import DEFAULT_TOMBSTONE_TTL, Attempt, GroupPermit
from .request import AcquireRequest, GroupAttemptOptions, PlaceOptions, check_partition, done_mode
from .semaphore import Semaphore

if TYPE_CHECKING:
    from typing_extensions import Unpack

#: the keyword arguments of SemaphoreGroup.try_acquire besides partition_caps
_GROUP_KEYS = frozenset(PlaceOptions.__optional_keys__)

__all__ = ["GroupPermit", "SemaphoreGroup"]


class SemaphoreGroup:
    """Acquire several semaphores at once: all or nothing.

    :param members: ``(semaphore, weight)`` pairs.  They are kept sorted by name (a fixed order
        for every group); names must be distinct, and every member must use the same Redis
        client (or URL) and ``key_prefix``.  On a ``redis.RedisCluster`` client they must also
        share one ``hash_tag``.

    The methods mean what :class:`~celery_semaphore.Semaphore`'s do, applied to every member
    at once, each in one round trip.
    """

    def __init__(self, members: Sequence[tuple[Semaphore, int]]) -> None:
        if isinstance(members, (str, bytes)) or not isinstance(members, Sequence):
            raise TypeError(
                "members must be a sequence of (Semaphore, weight) pairs, got "
                f"{type(members).__name__} {members!r}"
            )
        checked: list[tuple[Semaphore, int]] = []
        for item in members:
            if not isinstance(item, tuple) or len(item) != 2 or not isinstance(item[0], Semaphore):
                raise TypeError(
                    f"members must hold (Semaphore, weight) pairs, got {type(item).__name__} "
                    f"{item!r}"
                )
            sem, weight = item
            if sem.rates:
                raise ValueError(
                    f"members are not accepted: semaphore {sem.name!r} has rate="
                    f"{[str(r) for r in sem.rates]}; a SemaphoreGroup does not set rates yet "
                    "(a rate stored by the semaphore's own acquires still counts the group's "
                    "grants): use the semaphore without a group, or without rate="
                )
            if sem.adaptive:
                raise ValueError(
                    f"members are not accepted: semaphore {sem.name!r} has adaptive=True; a "
                    "SemaphoreGroup does not take adaptive members (an adaptive limit or a "
                    "throttle pause stored in Redis by the semaphore's own clients still holds "
                    "the group's grants back): use the semaphore without a group, or without "
                    "adaptive=True"
                )
            checked.append((sem, _validate.positive_int("weight", weight, maximum=sem.limit)))
        if not checked:
            raise ValueError("members=[] is not accepted: a group needs at least one semaphore")
        checked.sort(key=lambda pair: pair[0].name)
        names = [sem.name for sem, _ in checked]
        for a, b in itertools.pairwise(names):
            if a == b:
                raise ValueError(
                    f"members are not accepted: semaphore {a!r} appears twice; a group takes "
                    "each semaphore once (add the weights together)"
                )
        first = checked[0][0]
        for sem, _ in checked[1:]:
            if sem.key_prefix != first.key_prefix:
                raise ValueError(
                    f"members are not accepted: {sem.name!r} has key_prefix {sem.key_prefix!r} "
                    f"but {first.name!r} has {first.key_prefix!r}; all members need the same"
                )
            if not _same_redis(sem, first):
                raise ValueError(
                    f"members are not accepted: {sem.name!r} and {first.name!r} use different "
                    "Redis clients or URLs; all members need the same one"
                )
        self.members: tuple[tuple[Semaphore, int], ...] = tuple(checked)
        self._sems = [sem for sem, _ in checked]
        self._check_cluster(self._sems[0].client if first._url is None else None)
        self._scripts: ScriptSet | None = None
        self._key_args: tuple[bytes, ...] = ()
        self._init_lock = threading.Lock()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sem.name for sem in self._sems)

    def _check_cluster(self, client: Any) -> None:
        """One script may only touch one Redis Cluster slot: the members must share a
        hash_tag there."""
        if client is None or not isinstance(client, redis_lib.RedisCluster):
            return
        tags = {sem.hash_tag for sem in self._sems}
        if len(self._sems) > 1 and (len(tags) != 1 or None in tags):
            shown = ", ".join(f"{sem.name!r}: {sem.hash_tag!r}" for sem in self._sems)
            raise ValueError(
                f"members are not accepted on Redis Cluster: a group's semaphores must share "
                f"one hash_tag (the semaphore_hash_tag setting in Celery), got {shown}"
            )

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        return self._sems[0].client

    def _run(self, operation: str, args: list[Any]) -> list[Any]:
        scripts = self._scripts
        if scripts is None:
            client = self.client
            self._check_cluster(client)
            with self._init_lock:
                if self._scripts is None:
                    scripts = ScriptSet(client)
                    keys = [key for sem in self._sems for key in sem.keys.state_keys()]
                    self._key_args = scripts.key_args(keys)
                    self._scripts = scripts
                scripts = self._scripts
        dispatch = b"1" if all(sem.on_wake is not None for sem in self._sems) else b"0"
        try:
            reply: list[Any] = scripts.run(operation, self._key_args, args, dispatch)
        except RedisError as exc:
            raise self._error(exc) from exc
        return reply

    def _error(self, exc: RedisError) -> SemaphoreError:
        if isinstance(exc, ResponseError) and "WRONGTYPE" in str(exc):
            for sem in self._sems:
                state_error = sem._state_error()
                if state_error is not None:
                    return state_error
        return SemaphoreBackendError(
            f"semaphore group {list(self.names)!r}: Redis failed: {type(exc).__name__}: {exc}",
            name=self.names[0],
        )

    def _wake(self, items: list[Any]) -> None:
        """Wake the waiters a group script named, each through its member semaphore."""
        if items:
            for index, pairs in wire.group_wake_pairs(items).items():
                self._sems[index]._wake_pairs(pairs)

    def _limits(self) -> str:
        return wire.limits_text([sem.limit for sem in self._sems])

    def _lease_ttl(self) -> float:
        return min(sem.lease_ttl for sem in self._sems)

    def _aging_ms(self) -> int:
        return min(sem._aging_ms for sem in self._sems)

    # -- the low-level API ------------------------------------------------------------------

    def try_acquire(self, ticket: str, **options: Unpack[GroupAttemptOptions]) -> Attempt:
        """One atomic attempt on every member, in one round trip; never blocks.

        The parameters mean what :meth:`Semaphore.try_acquire`'s do; ``partition_caps`` maps
        member names to that member's cap for ``partition`` (absent: no cap).  When WAITING,
        ``position`` is the furthest back the ticket stands in any member's line.  A GRANTED
        or ALREADY_HELD attempt's ``permit`` is a :class:`GroupPermit`.
        """
        caps = options.pop("partition_caps", None)
        if not options.keys() <= _GROUP_KEYS:
            unknown = sorted(set(options) - _GROUP_KEYS)
            raise TypeError(
                f"SemaphoreGroup.try_acquire() got unexpected keyword argument(s) "
                f"{', '.join(unknown)}; it takes partition_caps, {', '.join(sorted(_GROUP_KEYS))}"
            )
        request = AcquireRequest(ticket, 1, **cast(PlaceOptions, options))  # (caps popped)
        _validate.ticket("ticket", ticket)
        request.check_times()
        request = request._replace(member_caps=self._caps(caps))
        self._check_partitions(request)
        return self._attempt(request)

    def _check_partitions(self, request: AcquireRequest) -> None:
        """Check the partition arguments of ``request`` in every member, and its done mode."""
        part, part_weight = request.partition, request.partition_weight
        for (_, weight), cap in zip(self.members, request.member_caps, strict=True):
            check_partition(weight, part, cap, part_weight)
        _validate.partition("partition", part)
        _validate.positive_int(
            "partition_weight", part_weight, maximum=_validate.MAX_PARTITION_WEIGHT
        )
        done_mode(request.check_done, request.new_execution)

    def _attempt(self, request: AcquireRequest) -> Attempt:
        """:meth:`try_acquire` of a checked ``request``: one script call."""
        members = [
            (weight, sem.limit, -1 if cap is None else cap)
            for (sem, weight), cap in zip(self.members, request.member_caps, strict=True)
        ]
        args = wire.group_acquire_args(request, members, self._lease_ttl(), self._aging_ms())
        attempt, wakes, error = wire.group_attempt(self, request, self._run("group_acquire", args))
        self._wake(wakes)
        if error is not None:
            raise error
        return attempt

    def _caps(self, partition_caps: Mapping[str, int | None] | None) -> tuple[int | None, ...]:
        if partition_caps is None:
            return (None,) * len(self._sems)
        if not isinstance(partition_caps, Mapping):
            raise TypeError(
                "partition_caps must be a mapping of member names to caps (int or None), got "
                f"{type(partition_caps).__name__} {partition_caps!r}"
            )
        unknown = sorted(set(partition_caps) - set(self.names))
        if unknown:
            raise ValueError(
                f"partition_caps={dict(partition_caps)!r} is not accepted: {unknown!r} are not "
                f"members of this group ({', '.join(map(repr, self.names))})"
            )
        return tuple(partition_caps.get(name) for name in self.names)

    def release_token(
        self,
        token: str,
        *,
        tombstone_ttl: float | None = None,
        claim: str = "",
        timed: bool = True,
        only_now: bool = False,
    ) -> bool:
        """Release ``token``'s permit in every member.  True when it was held (or this very
        release was already applied) in at least one member.  ``timed``, ``only_now``: as in
        :meth:`Semaphore.release_token` (``only_now``: True only when this call released it
        in some member)."""
        token = _validate.ticket("token", token)
        claim = _validate.text("claim", claim)
        tomb = _validate.optional_non_negative_seconds("tombstone_ttl", tombstone_ttl)
        tomb_ms = int((DEFAULT_TOMBSTONE_TTL if tomb is None else tomb) * 1000)
        args = wire.group_release_args(
            token, tomb_ms, self._aging_ms(), timed, claim, self._limits()
        )
        statuses, wakes = wire.group_release_reply(self._run("group_release", args))
        self._wake(wakes)
        return any(status in ((1,) if only_now else (1, 2)) for status in statuses)

    def refresh_token(
        self,
        token: str,
        *,
        lease_ttl: float | None = None,
        place_ttl: float | None = None,
        holder_only: bool = False,
        claim: str = "",
    ) -> float | None:
        """Extend the leases (or places) of ``token`` in every member.  Returns the new expiry
        in server epoch seconds, or None when it does not hold (with ``holder_only``) or wait
        in every member; with ``claim``, also when a member holds it under another claim."""
        token = _validate.ticket("token", token)
        claim = _validate.text("claim", claim)
        lease = _validate.optional_positive_seconds("lease_ttl", lease_ttl)
        place = _validate.optional_positive_seconds("place_ttl", place_ttl)
        default = self._lease_ttl()
        ms = self._sems[0]._ms
        args = wire.group_refresh_args(
            token,
            ms(lease or default),
            ms(place or default),
            self._aging_ms(),
            self._limits(),
            claim,
        )
        status, expiry, wakes = wire.refresh_reply(self._run("group_refresh", args))
        self._wake(wakes)
        if status in (0, 3) or (holder_only and status != 1):
            return None
        return expiry

    def withdraw(self, ticket: str) -> bool:
        """Give up the places of ``ticket`` in every member's line.  True if it had one."""
        ticket = _validate.ticket("ticket", ticket)
        args = wire.group_withdraw_args(ticket, self._aging_ms(), self._limits())
        status, _, wakes = wire.refresh_reply(self._run("group_refresh", args))
        self._wake(wakes)
        return status == 1

    # -- blocking ---------------------------------------------------------------------------

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
        """Block until ``ticket`` is granted in every member, stops waiting, or ``timeout``
        seconds pass (as :meth:`Semaphore.wait`): it blocks on its wake list in every member,
        so a release in any of them wakes it."""
        ticket = _validate.ticket("ticket", ticket)
        waiter = waiting.Waiter(
            self,
            self.try_acquire,
            [sem.keys.wake(ticket) for sem in self._sems],
            min(sem.poll_interval for sem in self._sems),
            f"semaphore group {list(self.names)!r}",
            self.names[0],
            "+".join(self.names),
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

    def acquire(
        self,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        ticket: str | None = None,
        owner: Mapping[str, Any] | None = None,
        place_ttl: float | None = None,
        partition: str = "",
        partition_caps: Mapping[str, int | None] | None = None,
        partition_weight: int = 1,
    ) -> GroupPermit | None:
        """Acquire every member's weight, all or nothing (as :meth:`Semaphore.acquire`)."""
        wait = _validate.optional_non_negative_seconds("timeout", timeout)
        own_ticket = ticket is None
        t = Semaphore.new_ticket() if ticket is None else _validate.ticket("ticket", ticket)
        kept = min(sem.lease_ttl for sem in self._sems) if place_ttl is None else place_ttl
        options: dict[str, Any] = {
            "owner": owner,
            "partition": partition,
            "partition_caps": partition_caps,
            "partition_weight": partition_weight,
        }
        if not blocking:
            attempt = self.try_acquire(t, place_ttl=0.0 if own_ticket else kept, **options)
        else:
            blocking_ttl = max(sem._blocking_place_ttl() for sem in self._sems)
            attempt = self.wait(
                t,
                timeout=wait,
                place_ttl=max(blocking_ttl, 0.0 if own_ticket else kept),
                keep_place=None if own_ticket else kept,
                **options,
            )
        permit = attempt.permit
        return permit if isinstance(permit, GroupPermit) else None

    @contextmanager
    def hold(
        self,
        *,
        timeout: float | None = None,
        partition: str = "",
        partition_caps: Mapping[str, int | None] | None = None,
        partition_weight: int = 1,
    ) -> Iterator[GroupPermit]:
        """``with group.hold(timeout=5) as permit:``: acquire every member or raise
        :class:`~celery_semaphore.SemaphoreTimeout`; release them together on exit."""
        started = clock.monotonic()
        permit = self.acquire(
            timeout=timeout,
            partition=partition,
            partition_caps=partition_caps,
            partition_weight=partition_weight,
        )
        if permit is None:
            waited = clock.monotonic() - started
            raise SemaphoreTimeout(
                f"semaphore group {list(self.names)!r}: no permit in every member within "
                f"{waited:.3f}s (timeout={timeout})",
                name=self.names[0],
                limit=self._sems[0].limit,
                waited=waited,
            )
        with permit:
            yield permit

    def __repr__(self) -> str:
        inner = ", ".join(f"{sem.name!r}*{weight}" for sem, weight in self.members)
        return f"<SemaphoreGroup [{inner}]>"


def _same_redis(a: Semaphore, b: Semaphore) -> bool:
    if a._url is not None or b._url is not None:
        return a._url == b._url
    return a._client is b._client
