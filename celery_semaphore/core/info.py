"""What the semaphore's reports hold: :meth:`~celery_semaphore.Semaphore.inspect`'s
:class:`Snapshot` (with its holders, waiters, partitions and rate windows) and
:meth:`~celery_semaphore.Semaphore.throttled`'s :class:`ThrottleResult`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .rates import Rate

__all__ = [
    "HolderInfo",
    "PartitionInfo",
    "RateWindowInfo",
    "Snapshot",
    "ThrottleResult",
    "WaiterInfo",
]


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
    #: the liveness ident of the process it was granted to (``liveness_ttl``); None: granted
    #: without one, so only its lease brings it back if its process dies
    process: str | None = None
    #: seconds until that process's liveness record expires (negative: it expired that long
    #: ago); None: no :attr:`process`, its record is gone, or the records cannot be read
    #: (a Redis Cluster)
    liveness_remaining: float | None = None
    #: True while its process's liveness record is live; False once the record expired or is
    #: gone (the process died or stalled: the next call for the name reclaims the holder);
    #: None: no :attr:`process`, or the records cannot be read
    process_alive: bool | None = None


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
    #: False while it keeps its place without being granted (``try_acquire(ready=False)``:
    #: a worker holds the task and has no free slot to start it in)
    ready: bool = True
    #: 0-9 (higher is served earlier), as the place was taken (0 for places taken before
    #: priorities existed)
    priority: int = 0


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
    #: seconds until the window has room for one more start and, when spaced, its spacing
    #: lets the next start in (0.0: both now)
    opens_in: float

    @property
    def available(self) -> int:
        """Weight that may still start in this window now (spaced: 0 until the next start is
        due, then the room left, taken by one start)."""
        if self.rate.spaced and self.opens_in > 0:
            return 0
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
    #: leases ever reclaimed after they expired (whoever's call noticed it), and holders
    #: reclaimed because their process's liveness record expired (:attr:`died_total`)
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
    #: attempts ever turned away because their line was full (``max_waiting``; a caller that
    #: asks again and is refused again counts again)
    full_total: int = 0
    #: places ever dropped to make room for newer waiters (``keep_newest``)
    dropped_total: int = 0
    #: of :attr:`reclaimed_total`, the holders reclaimed because their process's liveness
    #: record expired (the process died, or stalled past ``liveness_ttl``)
    died_total: int = 0

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
