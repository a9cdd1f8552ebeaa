"""Redis lost the semaphore's state under running tasks: detect it, and keep the limit.

A Redis without persistence that restarts (or a failover to a replica that lacked the keys,
or a flush) forgets every holder while their bodies still run.  Left alone, the next
acquires would see every unit free and grant them again: up to twice the limit at once.

Detection: every process that holds or waits on a semaphore reads its *boot marker*
(:meth:`~celery_semaphore.Semaphore.boot_marker`) about once a second, from the heartbeat's
sweep (:meth:`~celery_semaphore.Semaphore.sweep`: in the same call as the reclaim), and again
when a lease refresh finds its permit gone, or when a grant's fencing token is not above the
last one it saw (:func:`lost_at_grant`: how a process idle on the name when the state was
lost finds out, at its next grant).  A process that saw one marker and now finds another
knows the state was lost.  What a process remembers of a semaphore goes with the semaphore
object (dropped from the cache of :mod:`.locks`, and no permit left).

Then, with ``semaphore_restart_policy = "fail_closed"`` (the default), that process grants no
new permit for ``semaphore_restart_quarantine`` seconds (default: the lease_ttl), while the
heartbeat of every running body *re-asserts* its permit (acquires its own token again, at
once: nobody else is granted meanwhile).  After one lease every body still running holds its
permit again, and grants resume against a true count.  With ``"fail_open"`` there is no
quarantine (the re-assertion still happens): at most ``limit`` more bodies may run until the
old ones end.

The window: a process notices the loss within about a second (its next sweep); a grant it
makes before that is not prevented.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from .. import logs
from ..core import clock
from ..core.semaphore import Semaphore

__all__ = [
    "POLICIES",
    "configure",
    "detect",
    "lost_at_grant",
    "observe",
    "quarantined",
    "recently_lost",
]

POLICIES = ("fail_closed", "fail_open")

log = logs.get("restart")

_lock = threading.Lock()
#: id(semaphore) -> (policy, quarantine seconds or None for the lease_ttl)
_config: dict[int, tuple[str, float | None]] = {}
#: id(semaphore) -> the last boot marker this process saw
_seen: dict[int, str] = {}
#: id(semaphore) -> clock.monotonic() until which no new permit is granted here
_until: dict[int, float] = {}
#: id(semaphore) -> clock.monotonic() when this process noticed the loss
_lost_at: dict[int, float] = {}
#: id(semaphore) -> the highest fencing token this process saw granted
_fence: dict[int, int] = {}


def configure(sem: Semaphore, policy: str, quarantine: float | None) -> None:
    with _lock:
        new = id(sem) not in _config
        _config[id(sem)] = (policy, quarantine)
    if new:  # forget it with the object: ids are reused, and dynamic names are many
        weakref.finalize(sem, _forget, id(sem))


def _forget(key: int) -> None:
    """The semaphore whose id was ``key`` is gone: forget what this process noted of it."""
    with _lock:
        for table in (_config, _seen, _until, _lost_at, _fence):
            table.pop(key, None)


def detect(sem: Semaphore) -> bool:
    """Read ``sem``'s boot marker; True when it changed since this process last read it
    (the state was lost).  Starts the quarantine (fail_closed) and logs it.  Raises
    SemaphoreError when Redis fails."""
    _created, marker, fence = sem.boot_marker()
    return observe(sem, marker, fence)


def observe(sem: Semaphore, marker: str, fence: int) -> bool:
    """:func:`detect` with the boot marker and fence already read (by a sweep,
    :meth:`~celery_semaphore.Semaphore.sweep`)."""
    with _lock:
        before = _seen.get(id(sem))
        _seen[id(sem)] = marker
        lost = before is not None and before != marker
        if lost:
            _fence[id(sem)] = fence
        else:
            _fence[id(sem)] = max(fence, _fence.get(id(sem), 0))
        policy, window = _config.get(id(sem), ("fail_closed", None))
        seconds = sem.lease_ttl if window is None else window
        if lost:
            _lost_at[id(sem)] = clock.monotonic()
            if policy == "fail_closed" and seconds > 0:
                _until[id(sem)] = clock.monotonic() + seconds
    if lost:
        log.warning(
            "its state in Redis was lost (Redis restarted without persistence, failed over, or "
            "the keys were deleted); running tasks re-assert their permits%s",
            f", and no new permit is granted for {seconds:.1f}s (semaphore_restart_policy="
            "'fail_closed')"
            if policy == "fail_closed" and seconds > 0
            else " (semaphore_restart_policy='fail_open': new permits are granted at once)",
            semaphore=sem.name,
            task_id=None,
        )
    return lost


def lost_at_grant(sem: Semaphore, fence: int) -> bool:
    """A new grant (status GRANTED) came with fencing token ``fence``.  When it is not above
    every token this process saw before (a hint: the counter may have started again), the
    boot marker is read at once (:func:`detect`): the Redis call that made the grant may
    itself have been the first one on a restarted server (redis-py re-sends a call whose
    connection dropped), before any sweep could notice.  True when the state was lost and
    the grant must be given back (fail_closed): the caller then waits.  (The hint alone
    proves nothing: grants of other processes and threads race with this one.)"""
    with _lock:
        seen = _fence.get(id(sem))
        _fence[id(sem)] = max(fence, seen or 0)
        if seen is None or fence > seen:
            return False
    try:
        detect(sem)
    except Exception:  # Redis failing again: the next sweep checks the marker
        return False
    return quarantined(sem) > 0


def quarantined(sem: Any) -> float:
    """Seconds left in ``sem``'s quarantine in this process (0.0: none)."""
    until = _until.get(id(sem))
    if until is None:
        return 0.0
    left = until - clock.monotonic()
    if left <= 0:
        with _lock:
            _until.pop(id(sem), None)
        return 0.0
    return left


def recently_lost(sem: Any) -> bool:
    """Did this process notice, within the last two leases, that ``sem``'s state was lost?
    (A permit found gone then is re-asserted rather than reported lost.)"""
    at = _lost_at.get(id(sem))
    return at is not None and clock.monotonic() - at < 2 * float(sem.lease_ttl)
