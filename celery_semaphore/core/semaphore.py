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

import json
import math
import os
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import IntEnum
from types import TracebackType
from typing import Any, TypeVar

import redis as redis_lib
from redis.exceptions import RedisError, ResponseError

from .. import logs
from . import _validate, clock, connection
from ._scripts import ScriptSet
from .exceptions import (
    SemaphoreBackendError,
    SemaphoreError,
    SemaphoreStateError,
    SemaphoreTimeout,
)
from .keys import SemaphoreKeys, validate_prefix
from .rates import Rate, encode_rates, parse_rates

__all__ = [
    "HANDOFF_MARK",
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

log = logs.get("semaphore")

DEFAULT_URL = "redis://localhost:6379/0"
#: How long a released token is remembered, so a re-sent release reports success.
DEFAULT_TOMBSTONE_TTL = 10.0
_DEFAULT_TOMBSTONE_MS = max(1, int(DEFAULT_TOMBSTONE_TTL * 1000))  # as Semaphore._ms() gives it
#: A blocked waiter re-checks at least this often, in case a wake-up was lost.
DEFAULT_POLL_INTERVAL = 1.0
#: A head waiter that does not fit in the free units reserves them once it has waited this long.
DEFAULT_AGING = 2.0

WakeHandler = Callable[[str, str], None]
#: ``on_handoff(ticket, data, fencing_token, lease_expires_at, claim)``: see :class:`Semaphore`
HandoffHandler = Callable[[str, str, int, float, str], None]
#: seconds a forced release's reason stays readable
#: (:meth:`~celery_semaphore.Semaphore.release_reason`)
GONE_TTL = 600.0

#: Wake data ending with this marks a parked waiter that takes *handoffs*: a release (by a
#: Semaphore with ``on_handoff``) grants it the units it frees for it, under the claim its
#: owner metadata names (``owner["claim"]``, a non-empty string; the same claim it waits
#: with), rather than naming it to come and claim them.
HANDOFF_MARK = "#handoff"
_T = TypeVar("_T")


class AttemptStatus(IntEnum):
    """The outcome of one :meth:`Semaphore.try_acquire` (the script's status codes)."""

    GRANTED = 1  #: a new permit
    ALREADY_HELD = 2  #: this ticket and claim already held a permit; same permit returned
    HELD_ELSEWHERE = 3  #: the ticket holds a permit under another claim
    DONE = 4  #: the ticket was released recently (a tombstone exists)
    WAITING = 5  #: not granted; the place in line is kept
    WEIGHT_OVER_LIMIT = 6  #: the weight exceeds the (possibly overridden) limit
    NOT_QUEUED = 7  #: not granted, and no place was kept (``place_ttl=0``)
    STALE = 8  #: the place belongs to a newer epoch of this ticket


_STATUSES = {status.value: status for status in AttemptStatus}


@dataclass(frozen=True)
class HolderInfo:
    """One current holder, as :meth:`Semaphore.holders` reports it."""

    token: str
    weight: int
    fencing_token: int
    acquired_at: float  #: server epoch seconds
    lease_remaining: float  #: seconds
    owner: dict[str, Any]
    partition: str = ""  #: the partition it was granted in ("" is the default one)


@dataclass(frozen=True)
class WaiterInfo:
    """One live waiter, in arrival order, as :meth:`Semaphore.waiters` reports it."""

    ticket: str
    position: int  #: in its partition's line: 0 is the head
    weight: int
    waiting_since: float  #: server epoch seconds
    place_remaining: float  #: seconds until the place expires unless the waiter calls again
    parked: bool  #: True when the waiter is woken through wake data rather than by blocking
    owner: dict[str, Any]
    partition: str = ""  #: the partition whose line it stands in ("" is the default one)


@dataclass(frozen=True)
class PartitionInfo:
    """One partition with live holders or waiters, as :meth:`Semaphore.inspect` reports it."""

    name: str  #: "" is the default partition
    used: int  #: units its live holders hold
    waiters: int  #: live waiters in its line
    cap: int | None  #: the most units it may hold (None: no cap), as its last acquirer sent it
    weight: int  #: its partition weight, as its last acquirer sent it


@dataclass(frozen=True)
class RateWindowInfo:
    """One rate window, as :meth:`Semaphore.inspect` reports it."""

    rate: Rate  #: the window, as stored by the last acquirer
    started: int  #: weight started in the last ``rate.period_seconds`` (server clock)
    #: seconds until the window has room for one more start (0.0: it has room now)
    opens_in: float

    @property
    def available(self) -> int:
        """Weight that may still start in this window now."""
        return max(0, self.rate.count - self.started)


@dataclass(frozen=True)
class Snapshot:
    """Everything :meth:`Semaphore.inspect` read in one round trip."""

    name: str
    limit: int  #: the limit in force: the runtime override if set, else this object's
    limit_override: int | None
    used: int
    server_time: float
    holders: list[HolderInfo] = field(default_factory=list)
    waiters: list[WaiterInfo] = field(default_factory=list)
    #: partitions with live holders or waiters, by name
    partitions: list[PartitionInfo] = field(default_factory=list)
    grants_total: int = 0  #: grants ever made (the fencing-token counter)
    #: seconds a permit was held, averaged over recent releases (an exponential moving
    #: average: each release moves it 1/8 of the way to its own hold time; kept in whole ms);
    #: None before the first release.  Only releases of finished work count: not leases
    #: reclaimed after expiry, nor ``release_token(..., timed=False)`` (a forced release)
    hold_time_avg: float | None = None
    #: leases ever reclaimed after they expired (whoever's call noticed it)
    reclaimed_total: int = 0
    #: the rate windows in force (the last acquirer's ``rate=``, or the runtime rate
    #: override), by period; empty: no rate
    rates: list[RateWindowInfo] = field(default_factory=list)
    #: the runtime rate override (:meth:`Semaphore.set_rate_override`), by period; None: none
    #: (the acquirers' ``rate=`` is in force)
    rate_override: list[Rate] | None = None
    #: the adaptive limit stored in Redis when it is below :attr:`limit` (lowered by
    #: :meth:`Semaphore.throttled`, rising again as permits are released); None: not lowered
    adaptive_limit: int | None = None
    #: seconds until the throttle pause ends (server clock); None: no pause
    paused_for: float | None = None
    #: :meth:`Semaphore.throttled` calls ever (any client, adaptive or not)
    throttles_total: int = 0
    #: seconds since the last :meth:`Semaphore.throttled` call; None: never
    last_throttle_age: float | None = None

    @property
    def effective_limit(self) -> int:
        """The units that may be held now: :attr:`limit`, or the adaptive limit when it is
        lower.  (One waiter heavier than it may still start alone, when nothing is held.)"""
        lowered = self.adaptive_limit
        return self.limit if lowered is None else min(lowered, self.limit)

    @property
    def adaptive(self) -> bool:
        """True while an adaptive limit below :attr:`limit` is in force."""
        return self.adaptive_limit is not None and self.adaptive_limit < self.limit

    @property
    def available(self) -> int:
        """Units free now under :attr:`effective_limit` (a throttle pause still holds new
        grants back: see :attr:`paused_for`)."""
        return max(0, self.effective_limit - self.used)


@dataclass(frozen=True)
class ThrottleResult:
    """What :meth:`Semaphore.throttled` (or :meth:`Permit.throttled`) did."""

    #: True when this call opened a new congestion episode of an adaptive semaphore: the
    #: limit was halved (or was at 1 already, where it stays); False: not adaptive, or the
    #: throttle belongs to the episode of an earlier decrease
    decreased: bool
    #: the units that may be held now (the adaptive limit, or the limit in force)
    effective_limit: int
    #: seconds until the pause ends (this call's or a longer one set before); None: no pause
    paused_for: float | None
    #: throttles ever, this one included
    throttles_total: int


@dataclass(frozen=True, init=False)
class Attempt:
    """The result of :meth:`Semaphore.try_acquire`."""

    status: AttemptStatus
    permit: Permit | None = None
    position: int | None = None  #: for WAITING: in its partition's line, 0 is the head
    epoch: int = 0  #: for WAITING and STALE: the epoch of the place
    limit: int = 0  #: the limit in force when the script ran
    #: for WAITING: seconds until every rate window has room for this waiter's weight and a
    #: throttle pause (:meth:`Semaphore.throttled`) is over (server clock), when either is in
    #: the way; None: neither is (or no rate and no pause).  Nobody releases when a window
    #: opens or a pause ends: a waiter at the head of its line retries by itself then.
    rate_retry_after: float | None = None

    def __init__(
        self,
        status: AttemptStatus,
        permit: Permit | None = None,
        position: int | None = None,
        epoch: int = 0,
        limit: int = 0,
        rate_retry_after: float | None = None,
    ) -> None:
        # the generated __init__ of a frozen dataclass sets each field through
        # object.__setattr__; this one is on every acquire's path, so fill __dict__ at once
        self.__dict__.update(
            status=status,
            permit=permit,
            position=position,
            epoch=epoch,
            limit=limit,
            rate_retry_after=rate_retry_after,
        )


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


_owner_text: str | None = None


def _forget_owner() -> None:
    global _owner_text
    _owner_text = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_owner)


def _default_owner_text() -> str:
    """``{"host": ..., "pid": ...}`` as JSON, computed once per process (again after a fork)."""
    global _owner_text
    if _owner_text is None:
        _owner_text = json.dumps({"host": socket.gethostname(), "pid": os.getpid()})
    return _owner_text


class Permit:
    """A granted share of a semaphore: ``weight`` units, held under ``token``.

    ``fencing_token`` strictly increases per semaphore across grants; hand it to downstream
    systems so they can refuse a stale holder's writes.  A Permit is a context manager that
    releases on exit.
    """

    def __init__(
        self,
        semaphore: Semaphore,
        token: str,
        weight: int,
        fencing_token: int,
        lease_expires_at: float,
        claim: str = "",
    ) -> None:
        self.semaphore = semaphore
        self.token = token
        self.weight = weight
        self.fencing_token = fencing_token
        #: server epoch seconds at which the lease runs out, as of the last grant or refresh
        self.lease_expires_at = lease_expires_at
        self.claim = claim
        #: set when a refresh found the permit gone (its lease expired and was reclaimed)
        self.lost = False
        self._released = False
        self._lock = threading.Lock()

    @property
    def released(self) -> bool:
        return self._released

    def refresh(self, lease_ttl: float | None = None) -> bool:
        """Extend the lease by ``lease_ttl`` (default: the semaphore's) from now.

        Returns False, and sets :attr:`lost`, when the permit is no longer held.
        """
        if self._released:
            return False
        expiry = self.semaphore.refresh_token(
            self.token, lease_ttl=lease_ttl, holder_only=True, claim=self.claim
        )
        if expiry is None:
            self.lost = True
            return False
        self.lease_expires_at = expiry
        return True

    def release(self, *, tombstone_ttl: float | None = None) -> bool:
        """Give the units back.  Idempotent: only the first call talks to Redis.

        Returns True when this call released the permit, False when it was no longer held
        (lost to lease expiry, or already released).
        """
        with self._lock:
            if self._released:
                return False
            # A Redis failure raises SemaphoreBackendError and leaves the permit unreleased,
            # so the call can be retried (the release is idempotent per token).
            sem = self.semaphore
            token, claim = self.token, self.claim
            if tombstone_ttl is None and type(token) is str and token and type(claim) is str:
                # the usual case: token and claim were checked when the permit was granted
                result = sem._release(token, _DEFAULT_TOMBSTONE_MS, claim, True, True) in (1, 2)
            else:
                result = sem.release_token(
                    self.token, tombstone_ttl=tombstone_ttl, claim=self.claim
                )
            self._released = True
            return result

    def throttled(self, retry_after: float | None = None) -> ThrottleResult:
        """The call made under this permit was refused by the downstream service (429, 503):
        :meth:`Semaphore.throttled` with this permit's fencing token, so the episode rule is
        exact: a permit granted before the last decrease ran under the old limit, and its
        refusal lowers nothing more.  Callable after the release too."""
        return self.semaphore.throttled(retry_after, fencing_token=self.fencing_token)

    def __enter__(self) -> Permit:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return (
            f"<Permit {self.semaphore.name!r} token={self.token!r} weight={self.weight} "
            f"fencing_token={self.fencing_token}>"
        )


class Semaphore:
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
    """

    def __init__(
        self,
        name: str,
        limit: int,
        *,
        redis: redis_lib.Redis | redis_lib.RedisCluster | str | None = None,
        lease_ttl: float = 60.0,
        key_prefix: str = "celery_semaphore",
        timeout: float | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        on_wake: WakeHandler | None = None,
        aging: float = DEFAULT_AGING,
        hash_tag: str | None = None,
        on_handoff: HandoffHandler | None = None,
        rate: str | Rate | Sequence[str | Rate] | None = None,
        adaptive: bool = False,
    ) -> None:
        self.name = _validate.name("name", name)
        if not isinstance(adaptive, bool):
            raise TypeError(
                f"adaptive must be True or False, got {type(adaptive).__name__} {adaptive!r}"
            )
        #: whether :meth:`throttled` lowers the limit (see the ``adaptive`` parameter)
        self.adaptive = adaptive
        self.limit = _validate.positive_int("limit", limit)
        #: the rate windows, by period (empty: no rate)
        self.rates: tuple[Rate, ...] = parse_rates("rate", rate)
        self._rate_text = encode_rates(self.rates)
        #: the most weight one start may have under the rate (a window's smallest count)
        self._rate_max_weight = min((r.count for r in self.rates), default=None)
        self.lease_ttl = _validate.positive_seconds("lease_ttl", lease_ttl)
        self.key_prefix = validate_prefix(key_prefix)
        self.timeout = _validate.optional_non_negative_seconds("timeout", timeout)
        self.poll_interval = _validate.positive_seconds("poll_interval", poll_interval)
        self.on_wake = on_wake
        self.on_handoff = on_handoff if on_wake is not None else None
        self.aging = _validate.non_negative_seconds("aging", aging)
        self._aging_ms = int(self.aging * 1000)
        self.hash_tag = None if hash_tag is None else _validate.name("hash_tag", hash_tag)
        self.keys = SemaphoreKeys.for_name(self.name, self.key_prefix, self.hash_tag)
        if isinstance(redis, str):
            self._url: str | None = _validate.redis_url("redis", redis)
            self._client: Any = None
        elif redis is None:
            self._url, self._client = DEFAULT_URL, None
        elif hasattr(redis, "register_script"):
            self._url, self._client = None, redis
        else:
            raise TypeError(
                "redis must be a redis.Redis or redis.RedisCluster client, a redis://, "
                f"rediss:// or unix:// URL, or None; got {type(redis).__name__} {redis!r}"
            )
        self._scripts: ScriptSet | None = None
        self._key_args: tuple[bytes, ...] = ()
        self._init_lock = threading.Lock()
        self._local = threading.local()

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The redis-py client (created on first use when a URL was given)."""
        if self._client is None:
            with self._init_lock:
                if self._client is None:
                    self._client = connection.redis_client(self._url or DEFAULT_URL)
        return self._client

    def _run(self, operation: str, args: list[Any]) -> list[Any]:
        scripts = self._scripts
        if scripts is None:
            scripts = self._load_scripts()
        # last ARGV of every script: can this caller wake parked waiters? (see _lib.lua)
        dispatch = b"1" if self.on_wake is not None else b"0"
        try:
            reply: list[Any] = scripts.run(operation, self._key_args, args, dispatch)
        except RedisError as exc:
            raise self._error(exc) from exc
        return reply

    def _load_scripts(self) -> ScriptSet:
        client = self.client  # outside the lock: `client` takes the same (non-reentrant) lock
        with self._init_lock:
            if self._scripts is None:
                scripts = ScriptSet(client)
                self._key_args = scripts.key_args(self.keys.state_keys())
                self._scripts = scripts
            return self._scripts

    def _call(self, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except RedisError as exc:
            raise self._error(exc) from exc

    def _error(self, exc: RedisError) -> SemaphoreError:
        """The SemaphoreError for a redis-py error of one of our calls."""
        if not isinstance(exc, ResponseError):
            return SemaphoreBackendError(
                f"semaphore {self.name!r}: Redis at {self._where()} failed: "
                f"{type(exc).__name__}: {exc}",
                name=self.name,
            )
        if "WRONGTYPE" in str(exc):
            # A key holds another type than ours.  The scripts read every key before their
            # first write, so the command failed before changing anything; find the key.
            state_error = self._state_error()
            if state_error is not None:
                return state_error
        return SemaphoreBackendError(
            f"semaphore {self.name!r}: Redis refused the command: {exc}", name=self.name
        )

    def _where(self) -> str:
        """Where the client points, without a password (for error messages)."""
        if self._url is not None:
            return connection.safe_url(self._url)
        return connection.describe_client(self._client)

    def _state_error(self) -> SemaphoreStateError | None:
        """A SemaphoreStateError naming the first of our keys that holds a foreign type, or
        None when none does (any more) or Redis cannot tell."""
        keys = self.keys.state_keys()
        try:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.type(key)
            found = [_text(t) for t in pipe.execute()]
        except RedisError:
            return None
        for key, kind, expected in zip(keys, found, SemaphoreKeys.TYPES, strict=True):
            if kind not in ("none", expected):
                return SemaphoreStateError(
                    f"semaphore {self.name!r}: key {key!r} holds a {kind}, expected a {expected}; "
                    "something other than celery-semaphore wrote it. Nothing was changed: "
                    "remove or rename that key (or use another key_prefix).",
                    name=self.name,
                    key=key,
                )
        return None

    def _wake(self, pairs: list[Any]) -> None:
        """Wake the waiters a script named: push to blocked ones' lists, hand parked ones'
        data to ``on_wake``.  Best effort: a lost wake-up costs one poll interval."""
        blocked: list[str] = []
        for i in range(0, len(pairs) - 1, 2):
            ticket, data = _text(pairs[i]), _text(pairs[i + 1])
            if data:
                if self.on_wake is not None:
                    try:
                        self.on_wake(ticket, data)
                    except Exception:
                        log.exception(
                            "on_wake failed for %s", ticket, semaphore=self.name, task_id=None
                        )
            else:
                blocked.append(ticket)
        if not blocked:
            return
        ttl = max(1, int(self._blocking_place_ttl()))
        try:
            pipe = self.client.pipeline(transaction=False)
            for ticket in blocked:
                key = self.keys.wake(ticket)
                pipe.lpush(key, 1)
                pipe.expire(key, ttl)
            pipe.execute()
        except RedisError as exc:
            log.warning(
                "wake-up failed (%s); waiters will poll", exc, semaphore=self.name, task_id=None
            )

    def _handed(
        self,
        handler: HandoffHandler,
        ticket: str,
        data: str,
        fence: int,
        expires_at: float,
        claim: str,
    ) -> None:
        try:
            handler(ticket, data, fence, expires_at, claim)
        except Exception:
            # the grant comes back when its lease expires (the receiver never had it)
            log.exception(
                "on_handoff failed for %s; its grant comes back with its lease",
                ticket,
                semaphore=self.name,
                task_id=None,
            )

    def _blocking_place_ttl(self) -> float:
        return max(2.0, 3 * self.poll_interval)

    def _ms(self, seconds: float) -> int:
        return max(1, int(seconds * 1000))

    # -- the low-level API (for integrations) -----------------------------------------------

    @staticmethod
    def new_ticket() -> str:
        """A fresh, unique ticket for :meth:`try_acquire` or ``acquire(ticket=...)``."""
        # what uuid.uuid4().hex returns (122 random bits, version 4, RFC 4122 variant), built
        # without a UUID object, which costs several times more than the randomness
        raw = bytearray(os.urandom(16))
        raw[6] = (raw[6] & 0x0F) | 0x40
        raw[8] = (raw[8] & 0x3F) | 0x80
        return raw.hex()

    def try_acquire(
        self,
        ticket: str,
        *,
        weight: int = 1,
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
        partition_cap: int | None = None,
        partition_weight: int = 1,
    ) -> Attempt:
        """One atomic attempt, in one round trip.  Never blocks.

        :param ticket: the waiter's identity; keep it to keep your place (see the module doc).
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
        """
        ticket = _validate.ticket("ticket", ticket)
        weight = _validate.positive_int("weight", weight, maximum=self.limit)
        self._check_rate_weight(weight)
        place = _validate.non_negative_seconds("place_ttl", place_ttl)
        lease = _validate.optional_positive_seconds("lease_ttl", lease_ttl)
        grace = _validate.non_negative_seconds("wake_grace", wake_grace)
        _check_attempt(claim, wake_data, epoch)
        part, cap, part_weight = self._partition_args(
            weight, partition, partition_cap, partition_weight
        )
        return self._attempt(
            ticket,
            weight,
            owner,
            int(place * 1000),
            self._ms(lease or self.lease_ttl),
            int(grace * 1000),
            claim,
            wake_data,
            epoch,
            _done_mode(check_done, new_execution),
            part,
            cap,
            part_weight,
        )

    def _attempt(
        self,
        ticket: str,
        weight: int,
        owner: Mapping[str, Any] | None,
        place_ms: int,
        lease_ms: int,
        grace_ms: int,
        claim: str,
        wake_data: str,
        epoch: int,
        done_mode: int,
        part: str,
        cap: int,
        part_weight: int,
    ) -> Attempt:
        """:meth:`try_acquire` with its arguments checked and in the scripts' units."""
        owner_text = (
            json.dumps(dict(owner), default=str) if owner is not None else _default_owner_text()
        )
        # see acquire.lua for the ARGV; the integers travel as one argument
        numbers = (
            f"{weight} {self.limit} {lease_ms} {place_ms} {grace_ms} {epoch} {done_mode} {cap} "
            f"{part_weight} {self._aging_ms}"
        )
        reply = self._run(
            "acquire", [ticket, numbers, claim, owner_text, wake_data, part, self._rate_text]
        )
        status = _STATUSES[int(reply[0])]
        limit = int(reply[4])
        if len(reply) > 6:
            self._wake(reply[6:])
        if status is AttemptStatus.GRANTED or status is AttemptStatus.ALREADY_HELD:
            permit = Permit(self, ticket, weight, int(reply[1]), int(reply[2]) / 1000, claim)
            return Attempt(status, permit, None, 0, limit)
        if status is AttemptStatus.WAITING:
            rate_ms = int(reply[5])
            return Attempt(
                status,
                position=int(reply[1]),
                epoch=int(reply[2]),
                limit=limit,
                rate_retry_after=rate_ms / 1000 if rate_ms > 0 else None,
            )
        if status is AttemptStatus.STALE:
            return Attempt(status, epoch=int(reply[1]), limit=limit)
        if status is AttemptStatus.WEIGHT_OVER_LIMIT:
            raise ValueError(
                f"weight={weight} is not accepted for semaphore {self.name!r}: it exceeds the "
                f"limit in force ({limit}, a runtime override); use a weight from 1 to {limit}"
            )
        return Attempt(status, limit=limit)

    def _check_rate_weight(self, weight: int) -> None:
        most = self._rate_max_weight
        if most is not None and weight > most:
            raise ValueError(
                f"weight={weight} is not accepted for semaphore {self.name!r} with "
                f"rate={[str(r) for r in self.rates]}: a start counts its weight against every "
                f"window, and a window admits at most {most}; use a weight from 1 to {most} "
                "or a larger rate count"
            )

    @staticmethod
    def _partition_args(
        weight: int, partition: str, partition_cap: int | None, partition_weight: int
    ) -> tuple[str, int, int]:
        """Checked partition arguments as the scripts take them (cap -1: none)."""
        if partition == "" and partition_cap is None and partition_weight == 1:
            return "", -1, 1  # the usual case, checked at a glance
        part = _validate.partition("partition", partition)
        cap = _validate.optional_positive_int("partition_cap", partition_cap)
        part_weight = _validate.positive_int(
            "partition_weight", partition_weight, maximum=_validate.MAX_PARTITION_WEIGHT
        )
        if cap is not None and weight > cap:
            raise ValueError(
                f"weight={weight} is not accepted with partition_cap={cap} (partition "
                f"{part!r}): a waiter heavier than its partition's cap could never be granted; "
                f"use a weight from 1 to {cap} or a larger partition_cap"
            )
        return part, -1 if cap is None else cap, part_weight

    def release_token(
        self,
        token: str,
        *,
        tombstone_ttl: float | None = None,
        claim: str = "",
        timed: bool = True,
        handoff: bool = True,
        reason: str = "",
        only_now: bool = False,
    ) -> bool:
        """Release the permit held under ``token``.  True if it was held (or this very release
        was already applied by a re-sent call); False if it was not held.  ``only_now``: True
        only when this call released it, not when it was released already (its tombstone is
        there: the holder released it, or a re-sent call did).  With ``claim``,
        only a permit granted under that claim is released.  ``tombstone_ttl=0`` leaves no
        tombstone (the token may be acquired again at once).  ``timed=False``: the hold ended
        no finished work (a forced release, a grant given back unused), so it does not count
        in :attr:`Snapshot.hold_time_avg`.  ``handoff=False``: grant nothing by handoff (see
        ``on_handoff``), only name the waiters.  ``reason``: why someone other than the
        holder releases it (e.g. "forced by alice@ops-1"); kept for
        :data:`~celery_semaphore.core.semaphore.GONE_TTL` seconds, for the holder to read
        with :meth:`release_reason`."""
        token = _validate.ticket("token", token)
        claim = _validate.text("claim", claim)
        tomb = _validate.optional_non_negative_seconds("tombstone_ttl", tombstone_ttl)
        if reason:
            # written first: a holder that finds its permit gone finds the reason with it
            key = self.keys.gone(token)
            self._call(lambda: self.client.set(key, reason, px=int(GONE_TTL * 1000)))
        tomb_ms = self._ms(DEFAULT_TOMBSTONE_TTL) if tomb is None else int(tomb * 1000)
        status = self._release(token, tomb_ms, claim, timed, handoff)
        return status == 1 if only_now else status in (1, 2)

    def _release(self, token: str, tomb_ms: int, claim: str, timed: bool, handoff: bool) -> int:
        """:meth:`release_token` with its arguments checked, the tombstone time in ms."""
        # see release.lua for the ARGV; the integers travel as one argument
        handler = self.on_handoff if handoff else None
        handoff_ms = self._ms(self.lease_ttl) if handler is not None else 0
        reply = self._run(
            "release",
            [
                token,
                f"{self.limit} {tomb_ms} 1000 {self._aging_ms} {1 if timed else 0} {handoff_ms}",
                claim,
            ],
        )
        if handler is not None and len(reply) > 1:
            handed = int(reply[1])
            end = 2 + 5 * handed
            for i in range(2, end, 5):
                ticket, data, claim_to = _text(reply[i]), _text(reply[i + 1]), _text(reply[i + 4])
                fence, expires_at = int(reply[i + 2]), int(reply[i + 3]) / 1000
                self._handed(handler, ticket, data, fence, expires_at, claim_to)
            self._wake(reply[end:])
        elif len(reply) > 1:
            self._wake(reply[1:])
        return int(reply[0])

    def release_reason(self, token: str) -> str | None:
        """Why permit ``token`` was released by someone other than its holder (the
        ``reason`` given to :meth:`release_token`), or None: nobody said (its lease expired
        and was reclaimed, or it was released without a reason)."""
        raw = self._call(lambda: self.client.get(self.keys.gone(token)))
        return None if raw is None else _text(raw)

    def refresh_token(
        self,
        token: str,
        *,
        lease_ttl: float | None = None,
        place_ttl: float | None = None,
        holder_only: bool = False,
        claim: str = "",
    ) -> float | None:
        """Extend a holder's lease (or a waiter's place) from now.

        Returns the new expiry in server epoch seconds, or None when the token is neither
        holding nor waiting (with ``holder_only``: not holding).  With ``claim``, only a
        permit granted under that claim is extended: one held under another claim (another
        copy of the ticket) is left alone and reported as not held (None).
        """
        token = _validate.ticket("token", token)
        claim = _validate.text("claim", claim)
        lease = _validate.optional_positive_seconds("lease_ttl", lease_ttl)
        place = _validate.optional_positive_seconds("place_ttl", place_ttl)
        reply = self._run(
            "refresh",
            [
                token,
                self._ms(lease or self.lease_ttl),
                self._ms(place or self.lease_ttl),
                self.limit,
                1000,
                self._aging_ms,
                claim,
            ],
        )
        self._wake(reply[2:])
        status = int(reply[0])
        if status in (0, 3) or (holder_only and status != 1):
            return None
        return int(reply[1]) / 1000

    def withdraw(self, ticket: str, *, wake: bool = False) -> bool:
        """Give up a place in line.  True if there was one.  ``wake=True`` (someone else
        withdraws it, e.g. an operator's reset) also wakes the waiter itself, as a release
        would, so it finds out at once that its place is gone and asks again; a parked one is
        woken only through ``on_wake``."""
        ticket = _validate.ticket("ticket", ticket)
        flag = 1 if wake else 0
        reply = self._run("withdraw", [ticket, self.limit, 1000, self._aging_ms, flag])
        self._wake(reply[1:])
        return int(reply[0]) == 1

    def reclaim(self) -> int:
        """Take back expired leases and places now (normally done by every operation), and
        wake whoever the freed units belong to.  Returns the number of holders reclaimed."""
        reply = self._run("reclaim", [self.limit, 1000, self._aging_ms])
        self._wake(reply[1:])
        return int(reply[0])

    def sweep(self) -> tuple[int, str, int]:
        """:meth:`reclaim` and :meth:`boot_marker` in one round trip, as a heartbeat does
        about once a second for each semaphore its process uses: ``(holders reclaimed,
        marker, fence)``."""
        reply = self._run("sweep", [self.limit, 1000, self._aging_ms, self.new_ticket()])
        self._wake(reply[4:])
        return int(reply[0]), _text(reply[2]), int(reply[3] or 0)

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
        return bool(created), _text(marker), int(fence or 0)

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
            if stored is not None and _text(stored).startswith("="):
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
        adaptive = 1 if self.adaptive else 0
        numbers = f"{self.limit} {retry_ms} {adaptive} {fence} 1000 {self._aging_ms}"
        reply = self._run("throttle", [numbers])
        if len(reply) > 4:
            self._wake(reply[4:])
        paused_ms = int(reply[2])
        return ThrottleResult(
            decreased=int(reply[0]) == 1,
            effective_limit=int(reply[1]),
            paused_for=paused_ms / 1000 if paused_ms > 0 else None,
            throttles_total=int(reply[3]),
        )

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
        partition: str = "",
        partition_cap: int | None = None,
        partition_weight: int = 1,
    ) -> Permit | None:
        """Acquire ``weight`` units.

        Returns a :class:`Permit`, or None when ``blocking=False`` finds no room or when
        ``timeout`` seconds pass.  While blocked the caller holds a place in the FIFO line and
        is woken by the release that frees its units.

        :param ticket: keep your place across calls: when given and the call returns None,
            the place is kept for ``place_ttl`` seconds (default: ``lease_ttl``).  Without a
            ticket, a failed call leaves no trace.
        :param owner: free-form metadata stored with the permit (default: host and pid).
        :param partition: the partition's line to wait in; with ``partition_cap`` and
            ``partition_weight`` as in :meth:`try_acquire`.
        """
        _validate.positive_int("weight", weight, maximum=self.limit)
        self._check_rate_weight(weight)
        part, cap, part_weight = self._partition_args(
            weight, partition, partition_cap, partition_weight
        )
        wait = _validate.optional_non_negative_seconds("timeout", timeout)
        own_ticket = ticket is None
        t = self.new_ticket() if ticket is None else _validate.ticket("ticket", ticket)
        kept = self.lease_ttl if place_ttl is None else place_ttl
        if not blocking:
            # try_acquire's other checks are done above (or hold for its defaults)
            place = 0.0 if own_ticket else _validate.non_negative_seconds("place_ttl", kept)
            attempt = self._attempt(
                t,
                weight,
                owner,
                int(place * 1000),
                self._ms(self.lease_ttl),
                1000,  # try_acquire's default wake_grace, 1 s
                "",
                "",
                0,
                0,
                part,
                cap,
                part_weight,
            )
            return attempt.permit
        parts: dict[str, Any] = {
            "partition": partition,
            "partition_cap": partition_cap,
            "partition_weight": partition_weight,
        }
        attempt = self.wait(
            t,
            timeout=wait,
            place_ttl=max(self._blocking_place_ttl(), 0.0 if own_ticket else kept),
            keep_place=None if own_ticket else kept,
            weight=weight,
            owner=owner,
            **parts,
        )
        return attempt.permit

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
        deadline = None if timeout is None else clock.monotonic() + timeout
        ticket = _validate.ticket("ticket", ticket)
        wake_key = self.keys.wake(ticket)
        attempt: Attempt | None = None
        blocked = False
        try:
            while True:
                attempt = self.try_acquire(ticket, place_ttl=place_ttl, **attempt_options)
                if attempt.status is not AttemptStatus.WAITING:
                    return attempt
                next_poll = clock.monotonic() + self.poll_interval
                retry = attempt.rate_retry_after
                if retry is not None and attempt.position == 0:
                    # the head waits for a rate window: nobody releases when it opens, so it
                    # wakes by itself then (those behind it are named when it starts)
                    next_poll = min(next_poll, clock.monotonic() + retry)
                if deadline is not None:
                    next_poll = min(next_poll, deadline)
                while True:  # block until woken, the next poll, or give_up()
                    remaining = next_poll - clock.monotonic()
                    if remaining <= 0:
                        break
                    blocked = True
                    step = remaining if give_up is None else min(check_every, remaining)
                    if self._block(wake_key, step):
                        break
                    if give_up is not None and give_up():
                        return attempt
                if deadline is not None and clock.monotonic() >= deadline:
                    return attempt
        finally:
            waiting = attempt is None or attempt.status is AttemptStatus.WAITING
            self._leave(
                ticket,
                wake_key if blocked else None,
                waiting=waiting,
                keep_place=keep_place,
                claim=str(attempt_options.get("claim", "")),
            )

    def _block(self, wake_key: str, seconds: float) -> bool:
        """Block on the wake list; True when woken, False when the time ran out."""
        try:
            return self.client.blpop([wake_key], timeout=max(0.01, seconds)) is not None
        except redis_lib.exceptions.TimeoutError:
            return False  # the socket timeout is shorter than the block: just try again
        except RedisError as exc:
            raise SemaphoreBackendError(
                f"semaphore {self.name!r}: Redis failed while waiting: {exc}", name=self.name
            ) from exc

    def _leave(
        self,
        ticket: str,
        wake_key: str | None,
        *,
        waiting: bool,
        keep_place: float | None,
        claim: str,
    ) -> None:
        try:
            if waiting and keep_place is None:
                self.withdraw(ticket)
            elif waiting and keep_place is not None:
                # the caller keeps its place with its own ticket: restore the place's lifetime
                # (under its claim: a grant another copy holds meanwhile is not extended)
                self.refresh_token(ticket, place_ttl=max(0.001, keep_place), claim=claim)
            if wake_key is not None:
                self.client.delete(wake_key)
        except (RedisError, SemaphoreError) as exc:
            # best effort: never let a cleanup failure replace the exception (or result) of
            # the wait itself
            log.warning("cleanup after waiting failed: %s", exc, semaphore=self.name, task_id=None)

    @contextmanager
    def hold(
        self,
        *,
        weight: int = 1,
        timeout: float | None = None,
        partition: str = "",
        partition_cap: int | None = None,
        partition_weight: int = 1,
    ) -> Iterator[Permit]:
        """``with sem.hold(timeout=5) as permit:``: acquire or raise
        :class:`~celery_semaphore.SemaphoreTimeout`; release on exit."""
        started = clock.monotonic()
        permit = self.acquire(
            weight=weight,
            timeout=timeout,
            partition=partition,
            partition_cap=partition_cap,
            partition_weight=partition_weight,
        )
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

    # -- inspection -------------------------------------------------------------------------

    def inspect(self) -> Snapshot:
        """Holders, waiters and counts, read in one round trip on the server's clock."""
        reply = self._run("inspect", [])
        now_ms = int(reply[0])
        override_text = _text(reply[2])
        override = int(override_text) if override_text else None
        n_holders, n_waiters, n_parts = int(reply[3]), int(reply[4]), int(reply[5])
        hold_text = _text(reply[7])
        rest = reply[9:]
        holders = []
        for i in range(n_holders):
            token, expiry, weight, fence, acquired, owner, part = rest[7 * i : 7 * i + 7]
            holders.append(
                HolderInfo(
                    token=_text(token),
                    weight=int(weight),
                    fencing_token=int(_text(fence)),
                    acquired_at=int(_text(acquired)) / 1000,
                    lease_remaining=(float(_text(expiry)) - now_ms) / 1000,
                    owner=_owner(_text(owner)),
                    partition=_text(part),
                )
            )
        rest = rest[7 * n_holders :]
        found = []
        for i in range(n_waiters):
            ticket, expiry, weight, since, data, owner, part, pos, seq = rest[9 * i : 9 * i + 9]
            info = WaiterInfo(
                ticket=_text(ticket),
                position=int(pos),
                weight=int(weight),
                waiting_since=int(_text(since)) / 1000,
                place_remaining=(float(_text(expiry)) - now_ms) / 1000,
                parked=bool(data),
                owner=_owner(_text(owner)),
                partition=_text(part),
            )
            found.append((int(seq), info))
        found.sort(key=lambda pair: pair[0])  # the line is by partition; report arrival order
        rest = rest[9 * n_waiters :]
        partitions = []
        for i in range(n_parts):
            name, used, waiting, cap, part_weight = rest[5 * i : 5 * i + 5]
            partitions.append(
                PartitionInfo(
                    name=_text(name),
                    used=int(used),
                    waiters=int(waiting),
                    cap=None if int(cap) < 0 else int(cap),
                    weight=int(part_weight),
                )
            )
        rest = rest[5 * n_parts :]
        rates = []
        n_rates = int(rest[0])
        for i in range(n_rates):
            count, period_ms, started, opens_ms = rest[1 + 4 * i : 5 + 4 * i]
            rates.append(
                RateWindowInfo(
                    rate=Rate(int(count), int(period_ms) / 1000),
                    started=int(started),
                    opens_in=max(0, int(opens_ms)) / 1000,
                )
            )
        overridden, cwnd, pause_ms, throttles, last_ms = (
            int(v) for v in rest[1 + 4 * n_rates : 6 + 4 * n_rates]
        )
        limit = override if override is not None else self.limit
        return Snapshot(
            name=self.name,
            limit=limit,
            limit_override=override,
            used=int(reply[1]),
            server_time=now_ms / 1000,
            holders=holders,
            waiters=[info for _, info in found],
            partitions=partitions,
            grants_total=int(reply[6]),
            hold_time_avg=int(hold_text) / 1000 if hold_text else None,
            reclaimed_total=int(reply[8]),
            rates=rates,
            rate_override=[w.rate for w in rates] if overridden else None,
            adaptive_limit=cwnd if 0 < cwnd < limit else None,
            paused_for=pause_ms / 1000 if pause_ms > 0 else None,
            throttles_total=throttles,
            last_throttle_age=max(0, now_ms - last_ms) / 1000 if last_ms else None,
        )

    def available(self) -> int:
        """Units free right now (waiters in line may already be entitled to them)."""
        return self.inspect().available

    def holders(self) -> list[HolderInfo]:
        return self.inspect().holders

    def waiters(self) -> list[WaiterInfo]:
        return self.inspect().waiters

    def __repr__(self) -> str:
        rate = f" rate={[str(r) for r in self.rates]}" if self.rates else ""
        adaptive = " adaptive" if self.adaptive else ""
        return (
            f"<Semaphore {self.name!r} limit={self.limit}{rate}{adaptive} "
            f"prefix={self.key_prefix!r}>"
        )


def _check_attempt(claim: object, wake_data: object, epoch: object) -> None:
    """The str and int arguments of an attempt that the scripts take as they are."""
    _validate.text("claim", claim)
    _validate.text("wake_data", wake_data)
    _validate.non_negative_int("epoch", epoch)


def _done_mode(check_done: bool, new_execution: bool) -> int:
    """The scripts' ``check_done`` number: 1 report a released ticket as done, 2 forget that
    it was (a new execution of it), 0 neither."""
    if check_done and new_execution:
        raise ValueError(
            "check_done=True and new_execution=True are not accepted together: a call either "
            "continues an execution (check_done) or starts a new one (new_execution)"
        )
    return 1 if check_done else 2 if new_execution else 0


def _owner(raw: Any) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return {"raw": raw}
    return value if isinstance(value, dict) else {"value": value}
