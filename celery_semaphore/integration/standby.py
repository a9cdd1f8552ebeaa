"""Standby: a held task sent ahead into a free pool slot, where its gate forwards its grant.

A task the gate holds is granted by a release in another process, which pushes the grant onto
the gate's wake list; the gate's thread pops it and hands the request to the pool through the
consumer's event loop, and the pool starts it.  On prefork every one of those hops crosses a
process, and a 20 ms body waits about 3.5 ms for the next one to start.

So the gate sends the first few of its held tasks of a busy semaphore ahead, into free pool
slots (``semaphore_worker_standby`` per semaphore; by default 2 on prefork), *without* a
grant but with their place and claim (a ``standby`` directive).  The place stays as it is: a
release still hands the units to the gate, but the gate no longer goes through the event loop
and the pool: it forwards the grant onto the task's own list (:func:`.wakes.standby_key`),
where the body's wrapper blocks::

    gate        T held, position 1 ──► sent to the pool: standby, its claim, its list
    pool slot   BLPOP T's list (no Redis call before: the place is already in line)
    any worker  a holder's body ends ──► its release grants T the unit (a handoff, under T's
                claim) ──► RPUSH onto the gate's list (or a call, in the same process)
    gate        the grant is for a task standing by ──► RPUSH it onto T's list; send the
                next held task ahead
    pool slot   BLPOP returns the grant ──► the body runs (no further round trip)

What keeps it safe and fair:

* the place in line is the execution's, as for every task, and standby does not touch it:
  the line stays FIFO (and the partitions' shares hold) and no more than ``limit`` units are
  ever granted;
* every call carries the delivery's claim: the body adopts only a grant under its own claim,
  and its polls (which keep the place alive and find a grant whose item was lost) ask under
  it too;
* a standby takes a slot only while the pool has at least :data:`FREE_SLOTS` free (one stays
  free for other work) and only while the semaphore turns over (two grants on this worker
  within :data:`TURNOVER` seconds), so slow semaphores never tie up slots, and the solo pool
  never;
* a standby that is not granted within ``slot_wait_timeout`` parks, as a task waiting in its slot
  does (and frees the slot); one revoked meanwhile is told so by its gate and never runs.

This module keeps the gate's side (:class:`Standing`: who stands by, whether one more may)
and the body's (:func:`wait`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..core import clock
from ..core.exceptions import SemaphoreBackendError
from ..core.semaphore import Attempt, AttemptStatus, Semaphore
from . import wakes
from .locks import adopt

__all__ = [
    "Cancelled",
    "FREE_SLOTS",
    "PREFORK_DEFAULT",
    "TURNOVER",
    "Standing",
    "free_slots",
    "per_semaphore",
    "wait",
]

#: a standby is sent only while the pool has at least this many free slots
FREE_SLOTS = 2
#: ... and only while the semaphore turns over: its last two grants on this worker were both
#: made within this many seconds (one grant followed by a long hold sends nobody ahead)
TURNOVER = 1.0
#: seconds past its ``slot_wait_timeout`` after which the gate stops counting a standby it heard
#: nothing of (it parked, or its grant came through a path that sends no note)
SLACK = 1.0


class Cancelled(Exception):
    """The gate cancelled a standby: its task was revoked (or expired) while it stood by."""


@dataclass
class _Stand:
    name: str  # the semaphore's
    claim: str
    until: float  # monotonic: counted no longer after this


class Standing:
    """The gate's record of the tasks it sent ahead to stand by, per semaphore, and of when
    each semaphore last turned over on this worker.  Not thread-safe: the gate calls it under
    its lock."""

    def __init__(self, per_semaphore: int) -> None:
        self.per_semaphore = per_semaphore
        self._by_ticket: dict[str, _Stand] = {}
        self._count: dict[str, int] = {}
        #: semaphore name -> (the grant before the last, the last), monotonic
        self._turned: dict[str, tuple[float, float]] = {}

    def turned_over(self, name: str) -> None:
        """A grant was made on this worker for the semaphore ``name``."""
        last = self._turned.get(name, (float("-inf"), float("-inf")))[1]
        self._turned[name] = (last, clock.monotonic())

    def wanted(self, name: str) -> int:
        """How many more tasks of ``name`` may be sent ahead now (the pool aside)."""
        if self.per_semaphore <= 0:
            return 0
        turned = self._turned.get(name)
        if turned is None or clock.monotonic() - turned[0] > TURNOVER:
            return 0
        return max(0, self.per_semaphore - self._count.get(name, 0))

    def add(self, ticket: str, name: str, claim: str, wait_timeout: float) -> None:
        if ticket in self._by_ticket:
            self._drop(ticket)
        self._by_ticket[ticket] = _Stand(name, claim, clock.monotonic() + wait_timeout + SLACK)
        self._count[name] = self._count.get(name, 0) + 1

    def has(self, ticket: str, claim: str) -> bool:
        """Does the delivery ``ticket`` under ``claim`` stand by (as far as the gate knows)?"""
        stand = self._by_ticket.get(ticket)
        return stand is not None and stand.claim == claim

    def granted(self, ticket: str, claim: str) -> str | None:
        """The task sent ahead as ``ticket`` under ``claim`` was granted: it stands by no
        more.  Returns its semaphore's name (None: no such standby here)."""
        stand = self._by_ticket.get(ticket)
        if stand is None or stand.claim != claim:
            return None
        self._drop(ticket)
        self.turned_over(stand.name)
        return stand.name

    def expire(self) -> list[str]:
        """Stop counting the standbys past their time; the names of semaphores that have
        room again."""
        now = clock.monotonic()
        for name in [n for n, (_, last) in self._turned.items() if now - last > TURNOVER]:
            del self._turned[name]  # (dynamic names come and go)
        gone = [t for t, s in self._by_ticket.items() if s.until <= now]
        return sorted({self._drop(t) for t in gone})

    def tickets(self) -> list[str]:
        return list(self._by_ticket)

    def drop(self, ticket: str) -> None:
        if ticket in self._by_ticket:
            self._drop(ticket)

    def total(self) -> int:
        return len(self._by_ticket)

    def _drop(self, ticket: str) -> str:
        stand = self._by_ticket.pop(ticket)
        left = self._count.get(stand.name, 0) - 1
        if left > 0:
            self._count[stand.name] = left
        else:
            self._count.pop(stand.name, None)
        return stand.name


#: standbys per semaphore by default on the prefork pool (``semaphore_worker_standby=None``)
PREFORK_DEFAULT = 2


def per_semaphore(setting: int | None, pool: Any) -> int:
    """How many standbys per semaphore a gate keeps: the setting, or by default
    :data:`PREFORK_DEFAULT` on the prefork pool and none on the others, whose gate hands a
    grant to the pool in its own process (threads, gevent) or which have no slot to spare
    (solo)."""
    if setting is not None:
        return setting
    from celery.concurrency.prefork import TaskPool

    return PREFORK_DEFAULT if isinstance(pool, TaskPool) else 0


def free_slots(pool: Any) -> int:
    """How many of the pool's slots run nothing right now (0 when it cannot tell)."""
    from celery.worker import state

    try:
        size = int(pool.num_processes)
    except (AttributeError, TypeError, ValueError):
        return 0
    return size - len(state.active_requests)


# -- the body's side --------------------------------------------------------------------------


def wait(
    sem: Semaphore,
    ticket: str,
    claim: str,
    key: str,
    weights: Mapping[str, int],
    first: Attempt,
    ask: Callable[[], Attempt],
    timeout: float,
) -> Attempt:
    """Wait in the slot, standing by on the list ``key``, until ``ticket`` is granted (a
    handoff popped there, adopted without a round trip), stops waiting, or ``timeout``
    seconds pass; return the last :class:`Attempt`.  ``first`` is the last attempt known
    (WAITING); ``ask`` asks again (after a wake-up, and every ``poll_interval`` without an
    item, in case one was lost, keeping the place alive).  Redis failing raises
    :class:`SemaphoreBackendError`; the gate cancelling it (revoked), :class:`Cancelled`."""
    deadline = clock.monotonic() + timeout
    attempt = first
    client = sem.client
    granted = False
    try:
        while attempt.status is AttemptStatus.WAITING:
            remaining = deadline - clock.monotonic()
            if remaining <= 0:
                return attempt
            step = min(sem.poll_interval, remaining)
            if attempt.rate_retry_after is not None and attempt.position == 0:
                step = min(step, max(0.005, attempt.rate_retry_after))
            found = _pop(sem, client, key, step)
            if isinstance(found, wakes.Handoff) and found.ticket == ticket:
                if found.claim == claim:
                    permit = adopt(sem, ticket, weights, (found.fence,), found.expires_at, claim)
                    granted = True  # its list is empty now: no clean-up call
                    return Attempt(AttemptStatus.GRANTED, permit=permit, limit=sem.limit)
                continue  # another delivery's: not this one's to act on
            if isinstance(found, wakes.Cancel):
                if found.ticket == ticket and found.claim == claim:
                    raise Cancelled(ticket)
                continue
            if found is None or isinstance(found, wakes.Wake):
                attempt = ask()  # no item in time (a lost one?), or units were freed for it
        return attempt
    finally:
        if not granted and attempt.status is AttemptStatus.WAITING:
            # best effort: it expires (wakes.STANDBY_TTL); a grant left there is the park's
            with contextlib.suppress(RedisError):
                client.delete(key)


def _pop(
    sem: Semaphore, client: Any, key: str, seconds: float
) -> wakes.Wake | wakes.Handoff | wakes.Cancel | None:
    try:
        popped = client.blpop([key], timeout=max(0.01, seconds))
    except RedisTimeoutError:
        return None  # the socket timeout is shorter than the block: ask again
    except RedisError as exc:
        raise SemaphoreBackendError(
            f"semaphore {sem.name!r}: Redis failed while standing by: {exc}", name=sem.name
        ) from exc
    if popped is None:
        return None
    raw = popped[1]
    found = wakes.parse(raw.decode() if isinstance(raw, bytes) else str(raw))
    return found if isinstance(found, (wakes.Wake, wakes.Handoff, wakes.Cancel)) else None
