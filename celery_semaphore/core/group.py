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
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import redis as redis_lib
from redis.exceptions import RedisError, ResponseError

from . import _validate, clock
from ._scripts import ScriptSet
from .exceptions import SemaphoreBackendError, SemaphoreError, SemaphoreTimeout
from .semaphore import (
    DEFAULT_TOMBSTONE_TTL,
    Attempt,
    AttemptStatus,
    Permit,
    Semaphore,
    ThrottleResult,
    _check_attempt,
    _default_owner_text,
    _done_mode,
    log,
)

__all__ = ["GroupPermit", "SemaphoreGroup"]

_STATUSES = {status.value: status for status in AttemptStatus}


class GroupPermit(Permit):
    """A granted group: a permit in every member, under one token, released together.

    It is a :class:`~celery_semaphore.Permit` (its ``semaphore``, ``weight`` and
    ``fencing_token`` are the first member's); :attr:`permits` holds each member's own.
    Refresh and release it as a whole (a member's permit released on its own would leave the
    others held until their lease runs out).
    """

    def __init__(
        self,
        group: SemaphoreGroup,
        token: str,
        permits: Sequence[Permit],
        lease_expires_at: float,
        claim: str = "",
    ) -> None:
        first = permits[0]
        super().__init__(
            first.semaphore, token, first.weight, first.fencing_token, lease_expires_at, claim
        )
        self.group = group
        #: each member's permit, in the group's order
        self.permits: tuple[Permit, ...] = tuple(permits)

    def refresh(self, lease_ttl: float | None = None) -> bool:
        """Extend every member's lease; False (and ``lost``) when any is no longer held."""
        if self._released:
            return False
        expiry = self.group.refresh_token(
            self.token, lease_ttl=lease_ttl, holder_only=True, claim=self.claim
        )
        if expiry is None:
            self.lost = True
            return False
        self.lease_expires_at = expiry
        for permit in self.permits:
            permit.lease_expires_at = expiry
        return True

    def release(self, *, tombstone_ttl: float | None = None) -> bool:
        """Give back every member's units, in one script.  Idempotent; True when this call
        released the group (in at least one member)."""
        with self._lock:
            if self._released:
                return False
            result = self.group.release_token(
                self.token, tombstone_ttl=tombstone_ttl, claim=self.claim
            )
            self._released = True
            return result

    def throttled(self, retry_after: float | None = None) -> ThrottleResult:
        """Not for a group: which member's downstream refused the call is not known here.
        Call :meth:`~celery_semaphore.Permit.throttled` on that member's permit in
        :attr:`permits` instead."""
        raise TypeError(
            f"throttled() is not accepted on a GroupPermit ({', '.join(self.group.names)}): "
            "call it on the permit of the member whose downstream refused the call "
            "(group_permit.permits[i].throttled(...))"
        )

    def __enter__(self) -> GroupPermit:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        names = ", ".join(self.group.names)
        return f"<GroupPermit [{names}] token={self.token!r}>"


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

    def _wake(self, triples: list[Any]) -> None:
        """Wake the waiters a group script named, each through its member semaphore."""
        by_member: dict[int, list[Any]] = {}
        for i in range(0, len(triples) - 2, 3):
            by_member.setdefault(int(triples[i]) - 1, []).extend(triples[i + 1 : i + 3])
        for index, pairs in by_member.items():
            self._sems[index]._wake(pairs)

    def _limits(self) -> str:
        return " ".join(str(sem.limit) for sem in self._sems)

    def _aging_ms(self) -> int:
        return min(sem._aging_ms for sem in self._sems)

    # -- the low-level API ------------------------------------------------------------------

    def try_acquire(
        self,
        ticket: str,
        *,
        owner: Mapping[str, Any] | None = None,
        place_ttl: float = 0.0,
        claim: str = "",
        wake_data: str = "",
        wake_grace: float = 1.0,
        epoch: int = 0,
        check_done: bool = False,
        new_execution: bool = False,
        lease_ttl: float | None = None,
        partition: str = "",
        partition_caps: Mapping[str, int | None] | None = None,
        partition_weight: int = 1,
    ) -> Attempt:
        """One atomic attempt on every member, in one round trip; never blocks.

        The parameters mean what :meth:`Semaphore.try_acquire`'s do; ``partition_caps`` maps
        member names to that member's cap for ``partition`` (absent: no cap).  When WAITING,
        ``position`` is the furthest back the ticket stands in any member's line.  A GRANTED
        or ALREADY_HELD attempt's ``permit`` is a :class:`GroupPermit`.
        """
        ticket = _validate.ticket("ticket", ticket)
        place = _validate.non_negative_seconds("place_ttl", place_ttl)
        lease = _validate.optional_positive_seconds("lease_ttl", lease_ttl)
        grace = _validate.non_negative_seconds("wake_grace", wake_grace)
        _check_attempt(claim, wake_data, epoch)
        caps = self._caps(partition_caps)
        spec: list[str] = []
        for (sem, weight), cap in zip(self.members, caps, strict=True):
            _, cap_value, part_weight = sem._partition_args(
                weight, partition, cap, partition_weight
            )
            spec.append(f"{weight} {sem.limit} {cap_value}")
        part = _validate.partition("partition", partition)
        part_weight = _validate.positive_int(
            "partition_weight", partition_weight, maximum=_validate.MAX_PARTITION_WEIGHT
        )
        owner_text = (
            json.dumps(dict(owner), default=str) if owner is not None else _default_owner_text()
        )
        lease_ms = self._sems[0]._ms(lease or min(sem.lease_ttl for sem in self._sems))
        numbers = (
            f"{lease_ms} {int(place * 1000)} {int(grace * 1000)} {epoch} "
            f"{_done_mode(check_done, new_execution)} {part_weight} {self._aging_ms()}"
        )
        reply = self._run(
            "group_acquire",
            [ticket, numbers, claim, owner_text, wake_data, part, " ".join(spec)],
        )
        status = _STATUSES[int(reply[0])]
        m = int(reply[5])
        values = [int(v) for v in reply[6 : 6 + m]]
        if len(reply) > 6 + m:
            self._wake(reply[6 + m :])
        if status is AttemptStatus.GRANTED or status is AttemptStatus.ALREADY_HELD:
            expiry = int(reply[2]) / 1000
            permits = [
                Permit(sem, ticket, weight, fence, expiry, claim)
                for (sem, weight), fence in zip(self.members, values, strict=True)
            ]
            return Attempt(status, GroupPermit(self, ticket, permits, expiry, claim))
        if status is AttemptStatus.WAITING:
            return Attempt(status, position=int(reply[1]), epoch=int(reply[2]))
        if status is AttemptStatus.STALE:
            return Attempt(status, epoch=int(reply[1]))
        if status is AttemptStatus.WEIGHT_OVER_LIMIT:
            sem, weight = self.members[int(reply[4]) - 1]
            limit = int(reply[1])
            raise ValueError(
                f"weight={weight} is not accepted for semaphore {sem.name!r}: it exceeds the "
                f"limit in force ({limit}, a runtime override); use a weight from 1 to {limit}"
            )
        return Attempt(status)

    def _caps(self, partition_caps: Mapping[str, int | None] | None) -> list[int | None]:
        if partition_caps is None:
            return [None] * len(self._sems)
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
        return [partition_caps.get(name) for name in self.names]

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
        reply = self._run(
            "group_release",
            [
                token,
                f"{tomb_ms} 1000 {self._aging_ms()} {1 if timed else 0}",
                claim,
                self._limits(),
            ],
        )
        m = int(reply[0])
        statuses = [int(v) for v in reply[1 : 1 + m]]
        if len(reply) > 1 + m:
            self._wake(reply[1 + m :])
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
        default = min(sem.lease_ttl for sem in self._sems)
        first = self._sems[0]
        numbers = (
            f"r {first._ms(lease or default)} {first._ms(place or default)} 1000 {self._aging_ms()}"
        )
        reply = self._run("group_refresh", [token, numbers, self._limits(), claim])
        self._wake(reply[2:])
        status = int(reply[0])
        if status in (0, 3) or (holder_only and status != 1):
            return None
        return int(reply[1]) / 1000

    def withdraw(self, ticket: str) -> bool:
        """Give up the places of ``ticket`` in every member's line.  True if it had one."""
        ticket = _validate.ticket("ticket", ticket)
        reply = self._run(
            "group_refresh", [ticket, f"w 1 1 1000 {self._aging_ms()}", self._limits()]
        )
        self._wake(reply[2:])
        return int(reply[0]) == 1

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
        deadline = None if timeout is None else clock.monotonic() + timeout
        ticket = _validate.ticket("ticket", ticket)
        wake_keys = [sem.keys.wake(ticket) for sem in self._sems]
        poll = min(sem.poll_interval for sem in self._sems)
        attempt: Attempt | None = None
        blocked = False
        try:
            while True:
                attempt = self.try_acquire(ticket, place_ttl=place_ttl, **attempt_options)
                if attempt.status is not AttemptStatus.WAITING:
                    return attempt
                next_poll = clock.monotonic() + poll
                if deadline is not None:
                    next_poll = min(next_poll, deadline)
                while True:
                    remaining = next_poll - clock.monotonic()
                    if remaining <= 0:
                        break
                    blocked = True
                    step = remaining if give_up is None else min(check_every, remaining)
                    if self._block(wake_keys, step):
                        break
                    if give_up is not None and give_up():
                        return attempt
                if deadline is not None and clock.monotonic() >= deadline:
                    return attempt
        finally:
            waiting = attempt is None or attempt.status is AttemptStatus.WAITING
            claim = str(attempt_options.get("claim", ""))
            self._leave(ticket, wake_keys if blocked else [], waiting, keep_place, claim)

    def _block(self, wake_keys: list[str], seconds: float) -> bool:
        try:
            return self.client.blpop(wake_keys, timeout=max(0.01, seconds)) is not None
        except redis_lib.exceptions.TimeoutError:
            return False
        except RedisError as exc:
            raise SemaphoreBackendError(
                f"semaphore group {list(self.names)!r}: Redis failed while waiting: {exc}",
                name=self.names[0],
            ) from exc

    def _leave(
        self,
        ticket: str,
        wake_keys: list[str],
        waiting: bool,
        keep_place: float | None,
        claim: str,
    ) -> None:
        try:
            if waiting and keep_place is None:
                self.withdraw(ticket)
            elif waiting and keep_place is not None:
                self.refresh_token(ticket, place_ttl=max(0.001, keep_place), claim=claim)
            if wake_keys:
                self.client.delete(*wake_keys)
        except (RedisError, SemaphoreError) as exc:
            log.warning(
                "cleanup after waiting failed: %s",
                exc,
                semaphore="+".join(self.names),
                task_id=None,
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
