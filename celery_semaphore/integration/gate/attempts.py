"""Trying for a permit for a held task (any thread): its own attempts (``try_acquire`` under
its claim), and the grants and wake-ups a release sends it (a handoff, a wake-up)."""

from __future__ import annotations

import threading
from typing import Any

from ... import logs
from ...core import clock
from ...core.exceptions import SemaphoreError
from ...core.semaphore import Attempt, AttemptStatus
from .. import wakes
from ..delivery import HOLDING, Stage, task_id_of
from ..locks import (
    emit_waited,
    grant_of,
    lock_kwargs,
    lost_at_fence,
    lost_at_grant,
    quarantined,
    window_wait,
)
from ..wait_state import copy_of_execution
from . import giveback, reqs, timing
from .entry import Entry
from .forwarding import Ahead
from .waitlog import WaitLog

log = logs.get("gate")


class Attempts:
    """A held task's tries for its permit, and what a release sends it."""

    def __init__(self, ahead: Ahead, waits: WaitLog, stop: threading.Event) -> None:
        self.ahead = ahead
        self.to_pool = ahead.to_pool
        self.registry = ahead.registry
        self.health = ahead.health
        self.consumer = ahead.consumer
        self.waits = waits
        self._stop = stop

    def wake(self, ticket: str) -> None:
        """Units were freed for ``ticket``: claim them (called by a releaser of this process,
        or by the gate thread for wake-ups that came through Redis); one sent ahead to stand
        by is told on its own list."""
        with self.registry.lock:
            entry = self.registry.held_entry(ticket)
            if entry is None:
                left = self.registry.left_entry(ticket)
            elif entry.busy:
                entry.again = True
                return
            else:
                entry.busy = True
        if entry is None:
            if left is not None:
                self.ahead.forward(left, wakes.wake_item(ticket))
            return
        self.attempt(entry)

    def attempt(self, entry: Entry, *, first: bool = False) -> None:
        """One try_acquire for a held entry (the caller set ``entry.busy``); ``first``: its
        first, by the arrivals thread."""
        registry = self.registry
        while True:
            status = self._try(entry)
            with registry.lock:
                stopped = entry.stage not in HOLDING  # stop() gave it back meanwhile
                if not stopped and status is None and entry.again:
                    entry.again = False
                    continue
                registry.idle(entry)
                if stopped:
                    pass
                elif status is None:  # still waiting
                    registry.waits(entry)
                    if first and registry.count(entry):
                        self.consumer.qos.increment_eventually()
                        reqs.unreserve(entry.req)
                    if first:
                        self.waits.log(entry)
                        emit_waited(entry.sem, entry.req.id, entry.req.name, "held", entry.position)
                else:
                    if status == "granted":
                        registry.standing.turned_over(entry.sem.name)
                    registry.settle(entry, status)
            if stopped:
                if status == "granted":
                    giveback.give_back(entry, handoff=False)
                return
            if status is not None:
                self.to_pool.hand_over(entry, status)
            self.ahead.stand_by(entry.sem.name)
            return

    def handed(self, ticket: str, fence: int, expires_at: float, claim: str) -> None:
        """A release granted ``ticket`` its units by handoff, under ``claim`` (see
        ``Semaphore(on_handoff=...)``): hand the request to the pool with that grant, no
        further round trip.  Called by a releaser of this process, or by the gate thread for
        handoffs that came through Redis.  Only a grant under the claim of the delivery this
        gate holds (or held) for ``ticket`` counts; any other is not this gate's to act on."""
        registry = self.registry
        with registry.lock:
            entry = registry.held_entry(ticket)
            left = None
            if entry is not None and entry.claim != claim:
                entry = None  # not this delivery's grant: looked up among those that left
            if entry is not None and self._stop.is_set():
                return  # stop() withdraws its place: finding it granted, gives it back
            if entry is None:
                pending = registry.pending_entry(ticket)
                if pending is not None and pending.claim == claim:
                    return  # its own attempt found the same grant first
                found = registry.left_entry(ticket)
                left = found if found is not None and found.claim == claim else None
            elif entry.busy:
                entry.again = True  # the attempt under way tries again: it finds the grant
                return
            else:
                entry.busy = True
        if entry is None:
            if left is not None and self.ahead.forward(
                left, wakes.handoff_item(ticket, fence, expires_at, claim)
            ):
                return
            self._handed_elsewhere(ticket, left)
            return
        entry.refreshed = clock.monotonic()
        if quarantined(entry.sem) or lost_at_fence(entry.sem, fence):
            giveback.give_back_handoff(entry)  # granted on a state that was lost: hold on
            with registry.lock:
                registry.idle(entry)
                registry.held_on(entry)
            return
        entry.grant = ([fence], expires_at)
        entry.granted_at = clock.monotonic()
        with registry.lock:
            registry.idle(entry)
            entry.again = False
            registry.standing.turned_over(entry.sem.name)
            registry.settle(entry, "granted")
        self.to_pool.hand_over(entry, "granted")
        self.ahead.stand_by(entry.sem.name)

    def _handed_elsewhere(self, ticket: str, left: Entry | None) -> None:
        """A handoff for ``ticket`` that no held delivery here takes: ``left`` is the delivery
        it was made for, which left this gate (None: none with that claim)."""
        if left is not None and left.stage is Stage.HANDED_OVER:
            # its place and claim went to the pool (slot, park): the body acquires under the
            # same claim and finds this grant its own; giving it back could free a running body
            log.debug(
                "a handoff for ticket %s, whose place went to the pool with its claim",
                ticket,
                semaphore=left.sem.name,
                task_id=left.req.id,
            )
        elif left is not None:
            giveback.give_back_handoff(left)  # withdrawn (revoked, timed out, stopped)
        else:
            log.warning(
                "a handoff for ticket %s under a claim of no delivery this gate holds; its "
                "permit, if any, comes back when its lease expires",
                ticket,
                semaphore=None,
                task_id=task_id_of(ticket),
            )

    def _try(self, entry: Entry) -> str | None:
        """None while waiting; else what to do with the request: ``granted`` (run it with the
        grant) or ``slot`` (let the body's wrapper acquire: a redelivered copy whose previous
        delivery holds the permit, a duplicate, or Redis failing at the first try)."""
        entry.retry_at = 0.0  # only a fresh WAITING reply sets a time to try again
        if quarantined(entry.sem):
            return None  # the state was lost: hold on until the running bodies re-assert
        try:
            attempt = _ask(entry)
        except SemaphoreError as exc:
            self.health.failed()
            # Fail closed: keep holding (a held task never runs without a permit), try again
            # at the next tick.  A task Redis fails for on arrival goes to its slot instead,
            # where the wrapper parks it, so a Redis outage does not fill the consumer.
            waits = entry.counted and entry.stage is Stage.HELD
            log.warning(
                "task %s: semaphore unavailable (%s); %s",
                entry.req.name,
                exc,
                "it waits" if waits else "it goes to its slot to park",
                semaphore=entry.sem.name,
                task_id=entry.req.id,
            )
            return None if waits else "slot"
        except ValueError as exc:  # e.g. a weight above a lowered runtime limit
            log.error(
                "task %s: %s; it goes to its slot",
                entry.req.name,
                exc,
                semaphore=entry.sem.name,
                task_id=entry.req.id,
            )
            return "slot"
        return _read(entry, attempt)


def _ask(entry: Entry) -> Attempt:
    """``try_acquire`` for ``entry``, under its claim, its place named for this gate."""
    state = entry.state
    return entry.sem.try_acquire(
        entry.ticket,
        owner=entry.owner,
        place_ttl=entry.place_ttl,
        claim=entry.claim,
        wake_data=entry.wake_data,
        wake_grace=timing.WAKE_GRACE,
        epoch=state.epoch,
        # a copy of an execution may have run already; a first delivery is a new request
        check_done=copy_of_execution(state),
        new_execution=not copy_of_execution(state),
        lease_ttl=entry.opts.lease_ttl,
        **lock_kwargs(entry.plan),
        **_not_ready(entry),
    )


def _read(entry: Entry, attempt: Attempt) -> str | None:
    """What ``attempt`` (the reply to :func:`_ask`) means for ``entry`` (see ``_try``)."""
    entry.refreshed = clock.monotonic()
    if (
        attempt.status is AttemptStatus.GRANTED
        and attempt.permit is not None
        and lost_at_grant(entry.sem, attempt.permit)
    ):
        # granted on a state that was lost: give it back, hold on (fail closed)
        giveback.give_back(entry)
        return None
    if attempt.permit is not None:
        entry.grant = (grant_of(attempt.permit), attempt.permit.lease_expires_at)
        entry.granted_at = clock.monotonic()
        return "granted"
    if attempt.status is AttemptStatus.WAITING:
        entry.position = attempt.position
        after = attempt.rate_retry_after
        if after is not None:
            wait = window_wait(entry.sem, attempt.position or 0, after)
            if wait is not None:
                entry.retry_at = clock.monotonic() + wait
        return None
    return "slot"


def _not_ready(entry: Entry) -> dict[str, Any]:
    """``try_acquire``'s flag for a held task that is not ready (a single semaphore's only:
    a group's tasks are always ready)."""
    return {} if entry.ready else {"ready": False}
