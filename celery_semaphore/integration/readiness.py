"""A grant is a start: the gate lets a held task be granted only while a pool slot is free for it.

A grant handed to a pool whose slots are all busy waits there until one frees: the permit is
held (and a rate window counts the start) while the body does not run, and when the slots
free, the tasks granted meanwhile start together.  So every task the gate holds is, in the
semaphore's line, either

* **ready**: it may be granted: a release may grant it (a handoff), its own attempt may be
  granted, and its grant goes to the pool, where a free slot starts it at once; or
* **not ready**: it keeps its place and its turn (``try_acquire(ready=False)``), but is never
  granted: a ready task behind it, on this worker or another, goes first.

Each (semaphore, partition) of the held tasks may have as many ready tasks as the pool has
free slots (slots that run nothing and have nothing queued for them): within one line, no
more tasks are granted than free slots start; across lines, a line whose head cannot be
granted (its queue at its cap, its semaphore full) never keeps another line's tasks from the
slots.  (So with several lines, grants made at the same moment may outnumber the free slots,
at most by that many per line, and such a grant waits for the next slot.)  The gate makes
tasks ready as slots free (a body it sent to the pool ends, or the pool's count of running
and queued work drops), the earliest of each line first, and makes the latest not ready
again when other work takes the slots.  "Earliest" is the task's place in line: its arrival
moved earlier by its priority (``priority * priority_step``, as the semaphore orders its
line); so the ready tasks of a line are always its first ones, and a task that arrives with a
higher priority when no slot is left takes the place of the latest ready one (which stops
being ready) rather than wait behind it.  When other work keeps the pool's queue full, a task
not ready for :data:`QUEUE_AFTER` seconds goes to the pool to take its turn in that queue
(its body asks for the permit as it starts), so a steady flow of other tasks never starves
it.

This module works out the free slots (:func:`free_slots`) and the choices (:func:`pick`,
:func:`surplus`); the gate keeps
the flags (see :mod:`.gate.ready`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

__all__ = [
    "LOOK_AGAIN",
    "QUEUE_AFTER",
    "READY_POLL",
    "free_slots",
    "pick",
    "pool_size",
    "queued",
    "surplus",
    "swaps",
]

#: a held task that has not been ready for this many seconds while the pool has work queued
#: (more running and waiting in it than it has slots) goes to the pool to take its turn there
QUEUE_AFTER = 5.0
#: while held tasks are not ready, how often the gate looks whether the pool has room again
#: (a body the gate sent to the pool tells it at once when it ends; other work does not)
READY_POLL = 0.05
#: ... but it looks at every held task again only when the pool's free slots or the held tasks
#: (held, let go, made ready or not, a Redis call for one ended) changed, or this many seconds
#: passed since its last look
LOOK_AGAIN = 1.0


class Held(Protocol):
    """What :func:`pick` needs of a held task."""

    @property
    def ready(self) -> bool: ...
    @property
    def busy(self) -> bool: ...
    @property
    def order(self) -> float: ...
    @property
    def group(self) -> tuple[str, str]: ...


def pool_size(pool: Any) -> int | None:
    """The pool's number of slots (None when it cannot tell: then every task is ready)."""
    try:
        return int(pool.num_processes)
    except (AttributeError, TypeError, ValueError):
        return None


def free_slots(size: int, held_in_reserved: int, undispatched: int) -> int:
    """Pool slots that run nothing and have nothing queued for them: ``size`` less the pool's
    requests (Celery's reserved requests, running or waiting for a slot, less the
    ``held_in_reserved`` the gate holds among them), less the ``undispatched`` grants on
    their way to the pool (negative: work waits in the pool's queue)."""
    from celery.worker import state

    in_pool = len(state.reserved_requests) - held_in_reserved
    return size - in_pool - undispatched


def queued(size: int, held_in_reserved: int) -> bool:
    """Has the pool more requests than slots (work waiting in its queue)?"""
    from celery.worker import state

    return len(state.reserved_requests) - held_in_reserved > size


H = TypeVar("H", bound=Held)


def _lines(entries: Iterable[H]) -> dict[tuple[str, str], list[H]]:
    """The held tasks by (semaphore, partition), each in its order in line."""
    lines: dict[tuple[str, str], list[H]] = {}
    for entry in entries:
        lines.setdefault(entry.group, []).append(entry)
    for line in lines.values():
        line.sort(key=lambda e: e.order)
    return lines


def pick(entries: Iterable[H], free: int) -> list[H]:
    """The held tasks to make ready: in each (semaphore, partition), the earliest tasks in
    line (``order``) not ready, until it has ``free`` ready tasks."""
    chosen: list[H] = []
    for line in _lines(entries).values():
        room = free - sum(1 for e in line if e.ready)
        chosen += [e for e in line if not e.ready and not e.busy][: max(0, room)]
    return chosen


def swaps(
    entries: Iterable[H], free: int, movable: Callable[[H], bool] = lambda e: True
) -> list[tuple[H, H]]:
    """When the ready tasks of a line already take all ``free`` slots (after :func:`pick`),
    the pairs (earlier, later) to swap: a task not ready that stands in line before a ready
    one (not busy, and ``movable``: it may be made not ready) becomes ready, and that later
    one not ready, so a line's ready tasks are always its first ones.  The earliest waiting
    task takes the latest ready one's place, and so on while the waiting one is earlier."""
    pairs: list[tuple[H, H]] = []
    for line in _lines(entries).values():
        room = max(0, free - sum(1 for e in line if e.ready))
        # those pick() makes ready are left out
        waiting = [e for e in line if not e.ready and not e.busy][room:]
        later = [e for e in reversed(line) if e.ready and not e.busy and movable(e)]
        for early, late in zip(waiting, later, strict=False):
            if early.order >= late.order:
                break
            pairs.append((early, late))
    return pairs


def surplus(entries: Iterable[H], free: int) -> list[H]:
    """The ready held tasks to make not ready: in each (semaphore, partition), the latest
    ones in line (``order``) beyond ``free`` (``entries`` that are busy are left alone)."""
    chosen: list[H] = []
    for line in _lines(e for e in entries if e.ready).values():
        chosen += [e for e in line[max(0, free) :] if not e.busy]
    return chosen
