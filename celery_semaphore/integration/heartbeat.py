"""One lease-refresh thread per process.

Permits held by running tasks are registered here; a single daemon thread refreshes each of them
every ``interval`` seconds.  The thread is started lazily on the first registration in a process
and again after ``fork()`` (it checks the pid: ``fork`` copies only the calling thread), so it
works for prefork children, the threads pool (many permits in one process) and solo alike.

A refresh that finds the permit gone marks ``permit.lost``, logs an error naming the semaphore
and task, and calls the registered callback; the thread never dies on an exception.

The same thread also *sweeps* the semaphores this process is busy with, about once a second:
it runs ``sweep()`` on each, which takes back expired leases and wakes the waiters that free
units belong to.  That covers units freed by someone who cannot wake a parked Celery task (an
expired lease, a release from a script or the CLI).  Only the semaphores this process holds a
permit of, or waits on, are swept (:meth:`Heartbeat.active`): those of the permits registered
here, those a task waited for here within the last :data:`WAITED_SWEEP` seconds (in a slot,
parked, or held by a gate: :meth:`Heartbeat.waited`), those its sources name (a gate's held
tasks: :meth:`Heartbeat.add_source`), and those pinned with :meth:`Heartbeat.watch`.  A name
this process neither holds nor waits on costs nothing here: its expired leases are taken back
by the next script that runs for it anyway (every acquire, refresh and release reclaims first).

A lease refresh that fails is tried again a second later (:data:`REFRESH_RETRY`), and when a
sweep finds a Redis that failed answering again, the leases on it are refreshed at once: a
node cut off from Redis for longer than its liveness record lives learns that its permits
were taken about a second after Redis is back, not at its next interval.

A sweep never holds up a lease refresh: it works in slices of at most :data:`SWEEP_SLICE`
seconds between the refreshes.  A Redis client that fails a sweep is not tried again in the
same round, so a thousand names on a Redis that is down cost one failed call a second, not a
thousand.
"""

from __future__ import annotations

import math
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import logs
from ..core import clock
from ..core.group import GroupPermit
from ..core.semaphore import Permit, Semaphore
from . import events, restart
from .lost import log_loss

__all__ = ["Heartbeat", "heartbeat"]

log = logs.get("heartbeat")
#: a sweep that takes back expired leases reclaims other processes' permits
log_release = logs.get("release")

LostCallback = Callable[[Permit], None]
#: seconds between sweeps of the watched semaphores
SWEEP_INTERVAL = 1.0
#: the most seconds the thread sweeps before it looks at the leases due again
SWEEP_SLICE = 0.2
#: seconds a semaphore stays swept here after a task waited for it in this process: longer
#: than a parked copy stays away at the default back-off (``retry_backoff_max``, 30 s), so
#: units freed by an expired lease wake it, as a release would
WAITED_SWEEP = 60.0

#: seconds until a lease refresh that failed (Redis unreachable) is tried again, rather than
#: a whole interval (a third of the lease): a body whose permit was taken back meanwhile (its
#: node cut off longer than its liveness record lives) learns it about this soon after
#: Redis answers again
REFRESH_RETRY = 1.0

#: a callable naming semaphores this process waits on right now (e.g. a gate's held tasks)
Source = Callable[[], Iterable[Semaphore]]


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
    #: its last refresh failed (the failure was logged; the next is logged at DEBUG)
    failing: bool = False


class Heartbeat:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[int, _Entry] = {}
        self._pid = -1
        self._thread: threading.Thread | None = None
        self._changed = threading.Event()
        #: pinned with watch(): swept whatever this process does with them
        self._watched: dict[int, Semaphore] = {}
        #: id -> (semaphore, clock.monotonic() until which it is swept): a task waited for it
        self._waited: dict[int, tuple[Semaphore, float]] = {}
        self._sources: list[Source] = []
        self._next_sweep = 0.0
        #: the semaphores the sweep under way has still to visit
        self._round: deque[Semaphore] = deque()
        #: ids of the Redis clients that failed in this round (their semaphores are skipped)
        self._failed: set[int] = set()
        #: ids of the Redis clients whose last sweep failed: when one answers again, the
        #: leases on it are refreshed at once (see _answered)
        self._unreachable: set[int] = set()
        #: when the thread wakes next (inf while it works out its next sleep): a new permit
        #: due later needs no wake-up, which saves a thread switch per task
        self._wake_at = math.inf

    def watch(self, semaphore: Semaphore) -> None:
        """Sweep ``semaphore`` about once a second from now on (in this process), whether or
        not this process holds or waits on it (until :meth:`unwatch`)."""
        with self._lock:
            self._watched[id(semaphore)] = semaphore
            self._ensure_thread()

    def unwatch(self, semaphore: Semaphore) -> None:
        """Stop sweeping ``semaphore`` here (pinned, or marked by :meth:`waited`); a permit
        of it registered here still makes it swept."""
        with self._lock:
            self._watched.pop(id(semaphore), None)
            self._waited.pop(id(semaphore), None)
            if self._round:
                self._round = deque(s for s in self._round if s is not semaphore)

    def watched(self) -> list[Semaphore]:
        """The semaphores pinned or marked to be swept in this process right now (those of
        the permits it holds and of its sources are in :meth:`active`)."""
        now = clock.monotonic()
        with self._lock:
            marked = [sem for sem, until in self._waited.values() if until > now]
            return list({id(s): s for s in [*self._watched.values(), *marked]}.values())

    def waited(self, semaphore: Semaphore, seconds: float = WAITED_SWEEP) -> None:
        """A task waited for ``semaphore`` in this process (in a slot, parked, or held by a
        gate): sweep it for ``seconds`` from now, so units freed without a release (an
        expired lease) reach the waiters."""
        until = clock.monotonic() + seconds
        with self._lock:
            found = self._waited.get(id(semaphore))
            if found is None or found[1] < until:
                self._waited[id(semaphore)] = (semaphore, until)
            self._ensure_thread()
            signal = found is None and self._wake_at > clock.monotonic() + SWEEP_INTERVAL
        if signal:  # the thread sleeps long (nothing was swept): the first sweep comes soon
            self._changed.set()

    def add_source(self, source: Source) -> None:
        """``source()`` names semaphores this process waits on right now; it is asked at the
        start of each sweep (it must be quick and never block on Redis)."""
        with self._lock:
            if source not in self._sources:
                self._sources.append(source)

    def active(self) -> list[Semaphore]:
        """The semaphores a sweep visits now: those of the permits registered here, those
        marked by :meth:`waited` within its time, those the sources name, and those pinned
        with :meth:`watch`; each once."""
        now = clock.monotonic()
        with self._lock:
            for key in [k for k, (_, until) in self._waited.items() if until <= now]:
                del self._waited[key]
            found: dict[int, Semaphore] = dict(self._watched)
            for sem, _ in self._waited.values():
                found[id(sem)] = sem
            for entry in self._entries.values():
                permit = entry.permit
                members = permit.permits if isinstance(permit, GroupPermit) else (permit,)
                for member in members:
                    if isinstance(member.semaphore, Semaphore):
                        found[id(member.semaphore)] = member.semaphore
            sources = list(self._sources)
        for source in sources:
            try:
                for sem in source():
                    found[id(sem)] = sem
            except Exception as exc:  # a source never stops the sweep of the others
                log.debug("sweep source failed: %s", exc, semaphore=None, task_id=None)
        return list(found.values())

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
                wait = min(REFRESH_RETRY, entry.interval) if entry.failing else entry.interval
                entry.due = clock.monotonic() + wait
            next_due = min(next_due, entry.due)
        if self._round or self._sweep_wanted():
            # a slice of the sweep, ending before the next lease is due
            sweep = self._round or self._next_sweep <= now
            if sweep and self._sweep(min(clock.monotonic() + SWEEP_SLICE, next_due)):
                self._next_sweep = clock.monotonic() + SWEEP_INTERVAL
            next_due = min(next_due, clock.monotonic() if self._round else self._next_sweep)
        with self._lock:
            self._wake_at = next_due
        self._changed.wait(max(0.01, next_due - clock.monotonic()))

    def _sweep_wanted(self) -> bool:
        """Might a sweep find anything to visit (without asking the sources)?"""
        return bool(self._watched or self._waited or self._entries or self._sources)

    def _sweep(self, stop: float) -> bool:
        """Sweep the active semaphores, from where the last slice stopped, until ``stop``
        (one at least); True when the round is done."""
        if not self._round:
            active = self.active()
            with self._lock:
                self._round.extend(active)
            self._failed.clear()
        while self._round:
            with self._lock:
                if not self._round:
                    break  # unwatched meanwhile
                sem = self._round.popleft()
            client = id(sem.client)
            if client in self._failed:
                continue  # its Redis failed earlier in this round
            if not self._sweep_one(sem):
                self._failed.add(client)
                self._unreachable.add(client)
            elif client in self._unreachable:
                self._answered(client)
            if clock.monotonic() >= stop:
                break
        return not self._round

    def _answered(self, client: int) -> None:
        """The Redis client ``client`` answers again: refresh the leases on it now, not at
        their next interval, so a permit taken back meanwhile (a node cut off for longer than
        its liveness record lives) is known lost about a second after Redis is back."""
        self._unreachable.discard(client)
        now = clock.monotonic()
        with self._lock:
            for entry in self._entries.values():
                permit = entry.permit
                members = permit.permits if isinstance(permit, GroupPermit) else (permit,)
                if any(id(m.semaphore.client) == client for m in members):
                    entry.due = min(entry.due, now)

    def _sweep_one(self, sem: Semaphore) -> bool:
        """Check ``sem``'s state and take back its expired leases (one round trip); False
        when Redis failed."""
        try:
            reclaimed, died, marker, fence = sem.sweep_by_reason()  # ops: events (reclaimed =)
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
            if died:  # ops: events
                log_release.warning(
                    "reclaimed %d permit(s) of a dead process: its liveness record expired "
                    "(the process, or its whole worker, died or stalled past "
                    "semaphore_liveness_ttl)",
                    died,
                    semaphore=sem.name,
                    task_id=None,
                )
                events.emit(
                    "reclaimed", name=sem.name, count=died, reason="process_died", task_id=None
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
            say = log.debug if entry.failing else log.warning
            say(
                "lease refresh failed (token %s): %s; will retry",
                permit.token,
                exc,
                semaphore=permit.semaphore.name,
                task_id=entry.task_id,
            )
            entry.failing = True
            return
        entry.failing = False
        if alive or permit.released:
            return
        try:
            lost_state = restart.detect(permit.semaphore) or restart.recently_lost(permit.semaphore)
        except Exception:  # Redis failing again: report the loss as it stands
            lost_state = False
        if lost_state and self._reassert(entry):
            return
        self.unregister(permit)
        forced = log_loss(permit, entry.task_id)
        # ops: events
        events.emit(
            "lease_lost", name=permit.semaphore.name, task_id=entry.task_id, token=permit.token
        )
        if forced:  # an operator's release: counted where its task runs
            name = permit.semaphore.name
            events.emit("reclaimed", name=name, count=1, reason="forced", task_id=entry.task_id)
        if entry.on_lost is not None:
            try:
                entry.on_lost(permit)
            except Exception:
                log.exception(
                    "lease-lost callback failed",
                    semaphore=permit.semaphore.name,
                    task_id=entry.task_id,
                )


#: the process-wide heartbeat
heartbeat = Heartbeat()
