"""A grant is a start (see :mod:`..readiness`): the gate makes held tasks ready as pool slots
free, unready when other work took the slots set aside for them, and sends one that has not
been ready for long to take its turn in the pool's queue."""

from __future__ import annotations

import threading

from ... import logs
from ...core import clock
from ...core.semaphore import Semaphore
from .. import acks, readiness
from ..delivery import Stage
from .attempts import Attempts
from .entry import Entry

log_wait = logs.get("wait")


class Readying:
    """Moves held tasks between ready and not ready, as the pool's room comes and goes."""

    def __init__(self, attempts: Attempts, stop: threading.Event) -> None:
        self.attempts = attempts
        self.registry = attempts.registry
        self.to_pool = attempts.to_pool
        self.consumer = attempts.consumer
        self._stop = stop
        #: (free slots, the registry's version) at the last look at every held task, and when
        #: to look again even if neither changed (see ready_more)
        self._looked: tuple[int | None, int] = (None, -1)
        self._look_again = 0.0

    def ready_more(self) -> None:
        """Make held tasks ready while the pool has free slots for them (in each line, the
        earliest, see :func:`..readiness.pick`), and try each at once: one whose turn has come
        is granted.  With no slot left, a task not ready that stands in line before a ready
        one takes its place (:func:`..readiness.swaps`: the later one stops being ready).
        Called every :data:`..readiness.READY_POLL` while held tasks are not ready; it looks
        at every held task only when the free slots or the held tasks changed since its last
        look, or :data:`..readiness.LOOK_AGAIN` seconds passed."""
        registry = self.registry
        with registry.lock:
            if self._stop.is_set() or registry.not_ready() <= 0:
                return
            free = registry.free()
            if free is not None and free <= 0:
                return
            now = clock.monotonic()
            if (free, registry.version()) == self._looked and now < self._look_again:
                return  # nothing changed since the last look: no task to make ready
            entries = list(registry.held_entries())
            chosen = (
                [e for e in entries if not e.ready and not e.busy]
                if free is None
                else readiness.pick(entries, free)
            )
            pairs = [] if free is None else readiness.swaps(entries, free, _may_unready)
            earlier, later = [e for e, _ in pairs], [e for _, e in pairs]
            for entry in chosen + earlier + later:
                registry.set_ready(entry, entry not in later)
                entry.busy = True
            self._looked = (free, registry.version())
            self._look_again = now + readiness.LOOK_AGAIN
        # the earlier ones first: a grant made between two calls goes to one of them
        for entry in chosen + earlier + later:
            self.attempts.attempt(entry)

    def unready_surplus(self) -> None:
        """Other work took the free slots: in each line, the latest ready tasks beyond them
        stop being ready (each tells the line at once), so no grant comes for a task no slot
        starts."""
        registry = self.registry
        with registry.lock:
            free = registry.free()
            if free is None:
                return
            chosen = [
                e for e in readiness.surplus(registry.held_entries(), free) if _may_unready(e)
            ]
            for entry in chosen:
                registry.set_ready(entry, False)
                entry.busy = True
        for entry in chosen:
            self.attempts.attempt(entry)

    def queue_starved(self, now: float) -> None:
        """While other work keeps the pool's queue full, the earliest held task in line of each
        semaphore that has not been ready for :data:`..readiness.QUEUE_AFTER` seconds goes to
        the pool to take its turn in that queue (with its place and claim: its body asks for
        the permit as it starts)."""
        registry = self.registry
        with registry.lock:
            size = readiness.pool_size(getattr(self.consumer, "pool", None))
            if size is None or not readiness.queued(size, registry.uncounted()):
                return
            chosen: dict[str, Entry] = {}
            for entry in sorted(registry.held_entries(), key=lambda e: e.order):
                if (
                    not entry.ready
                    and not entry.busy
                    and entry.stage is Stage.HELD
                    and now - entry.unready_since >= readiness.QUEUE_AFTER
                    and entry.sem.name not in chosen
                ):
                    chosen[entry.sem.name] = entry
            for entry in chosen.values():
                registry.settle(entry, "slot")
        for entry in chosen.values():
            log_wait.info(
                "task %s: no pool slot free for it for %.0fs (other work fills the pool's "
                "queue); it takes its turn in that queue",
                entry.req.name,
                now - entry.unready_since,
                semaphore=entry.sem.name,
                task_id=entry.req.id,
            )
            # it waits for its permit in the slot: acknowledged when it ends, not as it starts
            acks.hold_until_granted(entry.req)
            self.to_pool.hand_over(entry, "slot")


def _may_unready(entry: Entry) -> bool:
    """May the ready ``entry`` be made not ready?  A group's tasks are always ready (its
    units are granted together by its own scripts)."""
    return isinstance(entry.sem, Semaphore)
