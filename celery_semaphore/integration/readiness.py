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
again when other work takes the slots.  When other work keeps the pool's queue full, a task
not ready for :data:`QUEUE_AFTER` seconds goes to the pool to take its turn in that queue
(its body asks for the permit as it starts), so a steady flow of other tasks never starves
it.

This module works out the free slots (:func:`free_slots`) and the choices (:func:`pick`,
:func:`surplus`); the gate keeps
the flags (see :mod:`.gate.ready`).
"""

from __future__ import annotations

from collections.abc import Iterable
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
    def since(self) -> float: ...
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


def pick(entries: Iterable[H], free: int) -> list[H]:
    """The held tasks to make ready: in each (semaphore, partition), the earliest tasks not
    ready, until it has ``free`` ready tasks."""
    ready: dict[tuple[str, str], int] = {}
    waiting: dict[tuple[str, str], list[H]] = {}
    for entry in entries:
        ready.setdefault(entry.group, 0)
        if entry.ready:
            ready[entry.group] += 1
        elif not entry.busy:
            waiting.setdefault(entry.group, []).append(entry)
    chosen: list[H] = []
    for group, line in waiting.items():
        line.sort(key=lambda e: e.since)
        chosen += line[: max(0, free - ready[group])]
    return chosen


def surplus(entries: Iterable[H], free: int) -> list[H]:
    """The ready held tasks to make not ready: in each (semaphore, partition), the latest
    ones beyond ``free`` (``entries`` that are busy are left alone)."""
    ready: dict[tuple[str, str], list[H]] = {}
    for entry in entries:
        if entry.ready:
            ready.setdefault(entry.group, []).append(entry)
    chosen: list[H] = []
    for line in ready.values():
        line.sort(key=lambda e: e.since)
        extra = line[max(0, free) :]
        chosen += [e for e in extra if not e.busy]
    return chosen
