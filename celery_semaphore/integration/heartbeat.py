"""One lease-refresh thread per process.

Permits held by running tasks are registered here; a single daemon thread refreshes each of them
every ``interval`` seconds.  The thread is started lazily on the first registration in a process
and again after ``fork()`` (it checks the pid: ``fork`` copies only the calling thread), so it
works for prefork children, the threads pool (many permits in one process) and solo alike.

A refresh that finds the permit gone marks ``permit.lost``, logs an error naming the semaphore
and task, and calls the registered callback; the thread never dies on an exception.

The same thread also *sweeps* the semaphores this process uses (:meth:`Heartbeat.watch`):
about once a second it runs ``reclaim()`` on each, which takes back expired leases and wakes
the waiters that free units belong to.  That covers units freed by someone who cannot wake a
parked Celery task (an expired lease, a release from a script or the CLI).  A sweep never
holds up a lease refresh: it works in slices of at most :data:`SWEEP_SLICE` seconds between
the refreshes.  A Redis client that fails a sweep is not tried again in the same round, so
a thousand names on a Redis that is down cost one failed call a second, not a thousand.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import logs
from ..core import clock
from ..core.group import GroupPermit
from ..core.semaphore import Permit, Semaphore
from . import events, restart

__all__ = ["Heartbeat", "heartbeat"]

log = logs.get("heartbeat")
#: a sweep that takes back expired leases reclaims other processes' permits
log_release = logs.get("release")

LostCallback = Callable[[Permit], None]
#: seconds between sweeps of the watched semaphores
SWEEP_INTERVAL = 1.0
#: the most seconds the thread sweeps before it looks at the leases due again
SWEEP_SLICE = 0.2


@dataclass
class _Entry:
    permit: Permit
    interval: float
    task_id: str | None
    on_lost: LostCallback | None
    due: float = field(default=0.0)
    #: the try_acquire arguments that take the permit again after its semaphore's state was
    #: lost (weight, partition and its cap, owner, lease); None: the permit's weight alone
    reacquire: Mapping[str, Any] | None = None


class Heartbeat:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[int, _Entry] = {}
        self._pid = -1
        self._thread: threading.Thread | None = None
        self._changed = threading.Event()
        self._watched: dict[int, Semaphore] = {}
        self._next_sweep = 0.0
        #: the semaphores the sweep under way has still to visit
        self._round: deque[Semaphore] = deque()
        #: ids of the Redis clients that failed in this round (their semaphores are skipped)
        self._failed: set[int] = set()
        #: when the thread wakes next (inf while it works out its next sleep): a new permit
        #: due later needs no wake-up, which saves a thread switch per task
        self._wake_at = math.inf

    def watch(self, semaphore: Semaphore) -> None:
        """Sweep ``semaphore`` about once a second from now on (in this process)."""
        with self._lock:
            self._watched[id(semaphore)] = semaphore
            self._ensure_thread()

    def unwatch(self, semaphore: Semaphore) -> None:
        """Stop sweeping ``semaphore`` (a dynamic name no longer used here)."""
        with self._lock:
            self._watched.pop(id(semaphore), None)

    def watched(self) -> list[Semaphore]:
        """The semaphores swept in this process right now."""
        with self._lock:
            return list(self._watched.values())

    def register(
        self,
        permit: Permit,
        *,
        interval: float,
        task_id: str | None = None,
        on_lost: LostCallback | None = None,
        reacquire: Mapping[str, Any] | None = None,
    ) -> None:
        """Keep ``permit``'s lease alive every ``interval`` seconds.  ``reacquire``: the
        try_acquire arguments it was granted with (partition, owner, lease), with which it is
        taken again if its semaphore's state is lost while the body runs."""
        due = clock.monotonic() + interval
        entry = _Entry(permit, interval, task_id, on_lost, due, reacquire)
        with self._lock:
            self._entries[id(permit)] = entry
            self._ensure_thread()
            signal = entry.due < self._wake_at
        if signal:
            self._changed.set()

    def unregister(self, permit: Permit) -> None:
        with self._lock:
            self._entries.pop(id(permit), None)

    def held(self) -> list[Permit]:
        """Permits registered in this process right now."""
        with self._lock:
            return [e.permit for e in self._entries.values()]

    def _ensure_thread(self) -> None:
        pid = os.getpid()
        if self._pid != pid or self._thread is None or not self._thread.is_alive():
            self._pid = pid
            self._changed = threading.Event()
            self._wake_at = math.inf
            self._thread = threading.Thread(
                target=self._loop, name="celery-semaphore-heartbeat", daemon=True
            )
            self._thread.start()

    def _loop(self) -> None:
        pid = os.getpid()
        while self._pid == pid:
            try:
                self._tick()
            except Exception:  # never let the thread die: the leases depend on it
                log.exception(
                    "heartbeat: unexpected error; carrying on", semaphore=None, task_id=None
                )
                clock.sleep(0.5)

    def _tick(self) -> None:
        with self._lock:
            entries = list(self._entries.values())
            self._wake_at = math.inf
            self._changed.clear()
        now = clock.monotonic()
        next_due = now + 5.0
        for entry in entries:
            if entry.due <= now:
                self._refresh(entry)
                entry.due = clock.monotonic() + entry.interval
            next_due = min(next_due, entry.due)
        if self._watched or self._round:
            # a slice of the sweep, ending before the next lease is due
            sweep = self._round or self._next_sweep <= now
            if sweep and self._sweep(min(clock.monotonic() + SWEEP_SLICE, next_due)):
                self._next_sweep = clock.monotonic() + SWEEP_INTERVAL
            next_due = min(next_due, clock.monotonic() if self._round else self._next_sweep)
        with self._lock:
            self._wake_at = next_due
        self._changed.wait(max(0.01, next_due - clock.monotonic()))

    def _sweep(self, stop: float) -> bool:
        """Sweep the watched semaphores, from where the last slice stopped, until ``stop``
        (one at least); True when the round is done."""
        if not self._round:
            with self._lock:
                self._round.extend(self._watched.values())
            self._failed.clear()
        while self._round:
            sem = self._round.popleft()
            if id(sem) not in self._watched:
                continue  # unwatched since the round began
            client = id(sem.client)
            if client in self._failed:
                continue  # its Redis failed earlier in this round
            if not self._sweep_one(sem):
                self._failed.add(client)
            if clock.monotonic() >= stop:
                break
        return not self._round

    def _sweep_one(self, sem: Semaphore) -> bool:
        """Check ``sem``'s state and take back its expired leases (one round trip); False
        when Redis failed."""
        try:
            reclaimed, marker, fence = sem.sweep()  # ops: events (reclaimed =)
        except Exception as exc:
            log.debug("sweep failed: %s", exc, semaphore=sem.name, task_id=None)
            return False
        try:
            if restart.observe(sem, marker, fence):
                self._reassert_all(sem)
            if reclaimed:  # ops: events
                log_release.warning(
                    "reclaimed %d permit(s) whose lease expired: a holder stopped refreshing "
                    "(its process crashed or stalled past lease_ttl)",
                    reclaimed,
                    semaphore=sem.name,
                    task_id=None,
                )
                events.emit(
                    "reclaimed", name=sem.name, count=reclaimed, reason="expired", task_id=None
                )
        except Exception as exc:
            log.debug("sweep failed: %s", exc, semaphore=sem.name, task_id=None)
            return False
        return True

    def _reassert_all(self, sem: Semaphore) -> None:
        """The state of ``sem`` was lost: take back the permits of the bodies running here."""
        with self._lock:
            entries = [e for e in self._entries.values() if e.permit.semaphore is sem]
        for entry in entries:
            self._reassert(entry)

    def _reassert(self, entry: _Entry) -> bool:
        """Acquire a running body's own token again after its semaphore's state was lost (see
        :mod:`celery_semaphore.integration.restart`); True when it holds its permit again."""
        permit = entry.permit
        if permit.released or isinstance(permit, GroupPermit):
            return False  # a group's grant is not re-asserted: it is reported lost
        again = dict(entry.reacquire or {"weight": permit.weight})
        again["owner"] = {**again.get("owner", {}), "task_id": entry.task_id, "reasserted": True}
        try:
            # in its own partition, with its own lease and owner: the partition's cap still
            # counts it, and a redelivery can still tell whether its process is alive
            attempt = permit.semaphore.try_acquire(permit.token, claim=permit.claim, **again)
        except Exception as exc:
            log.warning(
                "could not re-assert the permit after its state was lost: %s; will retry",
                exc,
                semaphore=permit.semaphore.name,
                task_id=entry.task_id,
            )
            return True  # keep the entry: the next refresh tries again
        if attempt.permit is None:
            return False
        permit.fencing_token = attempt.permit.fencing_token
        permit.lease_expires_at = attempt.permit.lease_expires_at
        permit.lost = False
        log.info(
            "re-asserted the permit of this running task after the state was lost",
            semaphore=permit.semaphore.name,
            task_id=entry.task_id,
        )
        return True

    def _refresh(self, entry: _Entry) -> None:
        permit = entry.permit
        if permit.released or permit.lost:
            self.unregister(permit)
            return
        try:
            alive = permit.refresh()
        except Exception as exc:  # a Redis blip: keep going, the lease has slack
            log.warning(
                "lease refresh failed (token %s): %s; will retry",
                permit.token,
                exc,
                semaphore=permit.semaphore.name,
                task_id=entry.task_id,
            )
            return
        if alive or permit.released:
            return
        try:
            lost_state = restart.detect(permit.semaphore) or restart.recently_lost(permit.semaphore)
        except Exception:  # Redis failing again: report the loss as it stands
            lost_state = False
        if lost_state and self._reassert(entry):
            return
        self.unregister(permit)
        _log_loss(permit, entry.task_id)
        # ops: events
        events.emit(
            "lease_lost", name=permit.semaphore.name, task_id=entry.task_id, token=permit.token
        )
        if entry.on_lost is not None:
            try:
                entry.on_lost(permit)
            except Exception:
                log.exception(
                    "lease-lost callback failed",
                    semaphore=permit.semaphore.name,
                    task_id=entry.task_id,
                )


def _log_loss(permit: Any, task_id: str | None) -> None:
    """Say why a running task's permit is gone: an operator forced its release (the reason
    they left), or its lease expired and was reclaimed, or another caller released it."""
    sem = permit.semaphore
    try:
        reason = sem.release_reason(permit.token) if isinstance(sem, Semaphore) else None
    except Exception:  # Redis failing: say what the lease tells
        reason = None
    if reason:
        log.warning(
            "permit RELEASED (token %s): %s; this task keeps running without it, so another "
            "task may now hold this unit",
            permit.token,
            reason,
            semaphore=sem.name,
            task_id=task_id,
        )
        return
    if permit.lease_expires_at <= time.time() + EXPIRY_SLACK:
        log.error(
            "permit LOST (token %s): its lease expired and was reclaimed, so another task may "
            "now hold this unit",
            permit.token,
            semaphore=sem.name,
            task_id=task_id,
        )
        return
    log.error(
        "permit LOST (token %s): released by another caller before its lease expired (a "
        "release_token() call or a reset without a reason), so another task may now hold "
        "this unit",
        permit.token,
        semaphore=sem.name,
        task_id=task_id,
    )


#: seconds of clock difference between this host and Redis tolerated when telling an expired
#: lease from an early release
EXPIRY_SLACK = 1.0


#: the process-wide heartbeat
heartbeat = Heartbeat()
