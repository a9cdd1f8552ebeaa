"""The deliveries a gate holds or held, indexed by stage, and the counts kept on them.

One lock guards it all: the held tasks (waiting for a permit, off the pool), those granted and
handed to the pool but not started yet (pending), those that left without a grant (kept a
while, in case a handoff for one was on its way: see :data:`.timing.LEFT_TTL`), those waiting
for a time rather than for a release (timed), the count of held tasks in the consumer's
prefetch window, and the count of held tasks a free pool slot is set aside for (ready: see
:mod:`..readiness`).  Every change of a delivery's stage goes through a method here, under
that lock: methods marked "(under the lock)" expect the caller to hold it; the others take it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from ...core import clock
from ...core.semaphore import Semaphore
from .. import readiness, wakes
from ..delivery import Stage
from ..standby import Standing
from . import timing
from .entry import Entry


class Stopped(NamedTuple):
    """What the gate gave up at stop (see :meth:`Registry.stop_all`)."""

    #: held: their places go
    held: list[Entry]
    #: left for the pool (to park or time out) but never got there: their places go
    stranded: list[Entry]
    #: granted, never handed to the pool: their grants go back
    undispatched: list[Entry]
    #: sent ahead to stand by: their places go
    standing: list[Entry]


class Registry:
    """The gate's deliveries by stage, under one lock (see the module's docstring)."""

    def __init__(
        self, consumer: Any, hold: int, standing: Standing, slot_freed: Callable[[], None]
    ) -> None:
        self.lock = threading.Lock()
        #: the most held tasks counted in the consumer's prefetch window
        self.hold = hold
        #: the held tasks sent ahead to stand by in pool slots (see :mod:`..standby`)
        self.standing = standing
        self._consumer = consumer
        #: a pool slot may be free: the arrivals thread makes held tasks ready for it
        self.slot_freed = slot_freed
        self._held: dict[str, Entry] = {}  # ticket -> waiting entry
        #: ticket -> (entry, when) of held tasks that left without a grant (see LEFT_TTL)
        self._left: dict[str, tuple[Entry, float]] = {}
        self._pending: dict[str, Entry] = {}  # ticket -> dispatched, not started yet
        #: ticket -> held entry waiting for a time (its ``retry_at``), not for a release
        self._timed: dict[str, Entry] = {}
        self._counted = 0
        #: held entries that are ready (a free slot set aside for each: see :mod:`..readiness`)
        self._ready = 0
        #: the same, by (semaphore, partition)
        self._ready_in: dict[tuple[str, str], int] = {}
        #: bumped at every change that may let a held task be made ready (one held or let go,
        #: made ready or not, a Redis call for one ended): see :meth:`version`
        self._version = 0
        #: bodies sent to the pool with this gate's claim (run, standby) whose pool child the
        #: reaper watches (see :mod:`.reaper`); None: nobody watches (not prefork)
        self._watched: set[Entry] | None = None
        #: set when a body is watched, so an idle reaper looks again
        self.watching = threading.Event()
        #: standbys whose places stop() withdrew: after the pool stops, a grant made to one
        #: the pool never started is given back (see ``Gate.after_pool_stopped``)
        self._stopped_standing: list[Entry] = []

    # -- reading (under the lock) ---------------------------------------------------------

    def held_entries(self) -> Iterable[Entry]:
        """(Under the lock) the held entries, oldest first."""
        return self._held.values()

    def has_held(self) -> bool:
        """(Under the lock) does it hold any task?"""
        return bool(self._held)

    def held_entry(self, ticket: str) -> Entry | None:
        """(Under the lock)"""
        return self._held.get(ticket)

    def is_held(self, entry: Entry) -> bool:
        """(Under the lock) is ``entry`` (this very one) held?"""
        return self._held.get(entry.ticket) is entry

    def pending_entry(self, ticket: str) -> Entry | None:
        """(Under the lock)"""
        return self._pending.get(ticket)

    def pending_entries(self) -> list[Entry]:
        """(Under the lock)"""
        return list(self._pending.values())

    def left_entry(self, ticket: str) -> Entry | None:
        """(Under the lock) the entry that left for ``ticket`` (see LEFT_TTL), if any."""
        found = self._left.get(ticket)
        return found[0] if found is not None else None

    def uncounted(self) -> int:
        """(Under the lock) held tasks not counted in the prefetch window: the pool's reserved
        requests include them."""
        return len(self._held) - self._counted

    def not_ready(self) -> int:
        return len(self._held) - self._ready

    # -- readiness (under the lock) ---------------------------------------------------------

    def free(self) -> int | None:
        """(Under the lock) pool slots that run nothing and have nothing queued for them
        (None: the pool cannot tell, and every task is ready)."""
        size = readiness.pool_size(getattr(self._consumer, "pool", None))
        if size is None:
            return None
        undispatched = sum(1 for e in self._pending.values() if not e.dispatched)
        return readiness.free_slots(size, self.uncounted(), undispatched)

    def version(self) -> int:
        """(Under the lock) changes when the held tasks, their readiness or their busy flags
        may have changed: with the free slots, the arrivals thread skips looking at every
        held task while both stay the same (see ``Readying.ready_more``)."""
        return self._version

    def idle(self, entry: Entry) -> None:
        """(Under the lock) the Redis call for ``entry`` ended: other threads may act on it."""
        entry.busy = False
        self._version += 1

    def may_ready(self, entry: Entry) -> bool:
        """(Under the lock) may ``entry``, not yet ready, be made ready now (its line has
        fewer ready tasks than the pool has free slots)?  A group's units are granted
        together by its own scripts: its tasks are always ready."""
        if not isinstance(entry.sem, Semaphore):
            return True
        free = self.free()
        return free is None or self._ready_in.get(entry.group, 0) < free

    def set_ready(self, entry: Entry, ready: bool) -> None:
        """(Under the lock) flag a held ``entry`` ready or not (its next attempt says so)."""
        if ready == entry.ready:
            return
        self._count_ready(entry, 1 if ready else -1)
        self._version += 1
        entry.ready = ready
        if not ready:
            entry.unready_since = clock.monotonic()

    def _count_ready(self, entry: Entry, step: int) -> None:
        self._ready += step
        count = self._ready_in.get(entry.group, 0) + step
        if count:
            self._ready_in[entry.group] = count
        else:
            self._ready_in.pop(entry.group, None)

    # -- transitions (under the lock) -------------------------------------------------------

    def admit(self, entry: Entry) -> bool:
        """(Under the lock) hold ``entry``, just received (its first attempt is the arrivals
        thread's: it is busy); False when another delivery of the same ticket is here."""
        if entry.ticket in self._held or entry.ticket in self._pending:
            return False
        entry.ready, entry.unready_since = False, clock.monotonic()
        self._held[entry.ticket] = entry
        self._version += 1
        self.set_ready(entry, self.may_ready(entry))
        entry.busy = True
        # Counted in the prefetch window from now on (if it is granted at once, the count
        # goes again): the consumer keeps taking messages while the arrivals thread asks
        # Redis, rather than waiting for a round trip per limited message.
        self.count(entry)
        return True

    def count(self, entry: Entry) -> bool:
        """(Under the lock) count ``entry`` in the prefetch window if there is room: True when
        it was counted now."""
        if entry.counted or self._counted >= self.hold:
            return False
        entry.counted = True
        self._counted += 1
        return True

    def held_on(self, entry: Entry) -> None:
        """(Under the lock) ``entry`` goes on waiting in the gate."""
        if entry.stage is Stage.RECEIVED:
            entry.delivery.move(Stage.HELD)

    def waits(self, entry: Entry) -> None:
        """(Under the lock) an attempt left ``entry`` waiting: for a time (its ``retry_at``),
        or for a release."""
        if entry.retry_at:
            self._timed[entry.ticket] = entry
        else:
            self._timed.pop(entry.ticket, None)
        self.held_on(entry)

    def settle(self, entry: Entry, status: str) -> None:
        """(Under the lock) ``entry`` stops waiting: it goes to the pool, with its grant
        (``granted``) or with its place and claim (``slot``, ``standby``: the body acquires
        under the same claim, so a grant a release hands off to the place meanwhile is the
        body's)."""
        self._unhold(entry)
        self._timed.pop(entry.ticket, None)
        self._uncount(entry)
        if status == "granted":
            entry.delivery.move(Stage.GRANTED)
            self._pending[entry.ticket] = entry
        else:
            entry.delivery.move(Stage.HANDED_OVER)
            self._note_left(entry)

    def _uncount(self, entry: Entry) -> None:
        if entry.counted:
            entry.counted = False
            self._counted -= 1
            self._consumer.qos.decrement_eventually()

    def _unhold(self, entry: Entry) -> None:
        """``entry`` leaves the held tasks; a slot set aside for it is free for another (the
        arrivals thread looks at once)."""
        if self._held.pop(entry.ticket, None) is not entry:
            return
        self._version += 1
        if entry.ready:
            self._count_ready(entry, -1)
            if len(self._held) > self._ready:
                self.slot_freed()

    def _note_left(self, entry: Entry) -> None:
        """``entry`` left without a grant (see LEFT_TTL)."""
        now = clock.monotonic()
        self._left[entry.ticket] = (entry, now)
        while self._left:
            oldest = next(iter(self._left))
            if now - self._left[oldest][1] < timing.LEFT_TTL and len(self._left) <= 10000:
                break
            del self._left[oldest]

    # -- transitions that take the lock -----------------------------------------------------

    def claim(self, entry: Entry) -> bool:
        """Mark a held, idle ``entry`` busy (this thread talks to Redis for it); False when it
        is busy or held no more."""
        with self.lock:
            if entry.busy or self._held.get(entry.ticket) is not entry:
                return False
            entry.busy = True
            return True

    def leave(self, entry: Entry, stage: Stage) -> bool:
        """``entry`` stops being held, for ``stage`` (revoked, timed out, or handed over to
        park); False when it is busy or held no more."""
        with self.lock:
            if entry.busy or self._held.get(entry.ticket) is not entry:
                return False
            self._unhold(entry)
            self._timed.pop(entry.ticket, None)
            entry.delivery.move(stage)
            self._note_left(entry)
            self._uncount(entry)
            return True

    def dispatching(self, entry: Entry) -> bool:
        """The hub hands ``entry`` to the pool now; False when the gate stopped and gave its
        grant back (the message is redelivered)."""
        with self.lock:
            if entry.stage is Stage.GIVEN_BACK:
                return False
            entry.dispatched = True
            if entry.stage is Stage.GRANTED:
                entry.delivery.move(Stage.RUNNING)
            return True

    def forget_pending(self, entry: Entry) -> None:
        """Its request is done in the pool (or its grant is released for it)."""
        with self.lock:
            if self._pending.get(entry.ticket) is entry:
                del self._pending[entry.ticket]
                entry.delivery.move(Stage.DONE)

    # -- bodies in the pool, watched for a dead child (see .reaper) -------------------------

    def watch_children(self) -> None:
        """Bodies sent to the pool are watched from now on (a reaper runs)."""
        with self.lock:
            if self._watched is None:
                self._watched = set()

    def watch(self, entry: Entry) -> None:
        """``entry``'s body went to the pool with this gate's claim (a grant to run, or a
        standby that may be granted in its slot): its child is watched until it ends."""
        with self.lock:
            if self._watched is None:
                return
            self._watched.add(entry)
        self.watching.set()

    def unwatch(self, entry: Entry) -> None:
        with self.lock:
            if self._watched is not None:
                self._watched.discard(entry)

    def watched(self) -> list[Entry]:
        """The bodies in the pool whose child is watched."""
        with self.lock:
            return list(self._watched or ())

    def next_retry(self) -> float:
        """When the first held task waiting for a time (a rate window) is due."""
        with self.lock:
            return min((e.retry_at for e in self._timed.values()), default=float("inf"))

    def take_due(self, now: float) -> list[Entry]:
        """The held tasks waiting for a time that has come (they wait for it no more)."""
        with self.lock:
            due = [e for e in self._timed.values() if e.retry_at <= now]
            for entry in due:
                del self._timed[entry.ticket]
            return due

    def stop_all(self) -> Stopped:
        """The gate stops: every delivery it holds, or granted without handing it to the
        pool, is given back (see ``Gate.stop``), and it no longer counts standbys."""
        with self.lock:
            # left for the pool (to park or time out) but never got there: the broker delivers
            # them again, and their places must not take handoffs meanwhile
            stranded = [
                e
                for e, _ in self._left.values()
                if e.stage in (Stage.HANDED_OVER, Stage.TIMED_OUT) and not e.dispatched
            ]
            held = list(self._held.values())
            self._held.clear()
            self._ready = 0
            self._ready_in.clear()
            self._timed.clear()
            # sent ahead to stand by: the pool may drop a job it has not started at stop, and
            # nobody forwards a grant any more; their places go (a body that stands by asks
            # again at its next poll, under its claim, and a grant already made stays its own)
            standing = [self._left[t][0] for t in self.standing.tickets() if t in self._left]
            for entry in standing:
                self.standing.drop(entry.ticket)
            self._stopped_standing.extend(standing)
            undispatched = [e for e in self._pending.values() if not e.dispatched]
            for entry in stranded + held + undispatched:
                entry.delivery.move(Stage.GIVEN_BACK)
            for entry in held:
                self._note_left(entry)
            self._counted = 0
            for entry in undispatched:
                del self._pending[entry.ticket]
        return Stopped(held, stranded, undispatched, standing)

    def never_started(self) -> tuple[list[Entry], list[Entry]]:
        """The pool stopped: the grants handed to it whose jobs never started (given back:
        they leave), and the standbys withdrawn at stop that never started."""
        with self.lock:
            never = [
                e
                for e in self._pending.values()
                if e.dispatched and e.stage is Stage.RUNNING and e.req.time_start is None
            ]
            for entry in never:
                del self._pending[entry.ticket]
                entry.delivery.move(Stage.GIVEN_BACK)
            standing = [e for e in self._stopped_standing if e.req.time_start is None]
            self._stopped_standing.clear()
        return never, standing

    # -- inspection -------------------------------------------------------------------------

    def tickets(self) -> list[str]:
        with self.lock:
            return list(self._held)

    def snapshot(self) -> list[wakes.HeldTask]:
        """The requests held right now, oldest first (see ``Gate.snapshot``)."""
        now = clock.monotonic()
        with self.lock:
            entries = sorted(self._held.values(), key=lambda e: e.since)
            return [
                wakes.HeldTask(
                    task_id=str(e.req.id),
                    task=str(e.req.name),
                    semaphore=e.sem.name,
                    stage=e.stage.value,
                    waited=round(now - e.since, 3),
                    position=e.position,
                    counted=e.counted,
                )
                for e in entries
            ]
