"""Acquire in the worker slot: the path of a task that reaches its body without a grant.

That is a task that did not come through a gate (``semaphore_worker_hold = 0``, a pool
without an event loop), one the gate handed over (held too long, or Redis failed at its
attempt), one whose grant lapsed before the pool started it, and one sent ahead to stand by
(see :mod:`.slot_standby`).  It asks under its delivery's claim: granted, it runs; near the
head of the line (``slot_waiters``) it waits in its slot up to ``slot_wait_timeout``; else,
or still waiting then, it parks (:mod:`.park`).

A redelivery whose previous delivery still holds the ticket's permit takes it over when that
delivery's process is gone from this machine (SIGKILL with ``reject_on_worker_lost``: Celery
tells nobody); otherwise it waits (parked) until that permit is released or its lease expires.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

from .. import logs
from ..core.exceptions import SemaphoreBackendError
from ..core.semaphore import Attempt, AttemptStatus, Semaphore
from . import events
from .asking import (
    IN_SLOT_PLACE_TTL,
    PLACE_SLACK,
    Run,
    ask,
    check_grant,
    common_args,
    drop_duplicate,
    log_unavailable,
)
from .delivery import delivery_claim, host_owner, task_id_of, ticket_of
from .full import REFUSED, on_full
from .hold import hold
from .locks import Lock, emit_waited, quarantine_guard
from .park import park
from .slot_standby import stand_by
from .wait_state import WaitState

__all__ = ["acquire_and_run"]

log_wait = logs.get("wait")
log_release = logs.get("release")

_T = TypeVar("_T")


def acquire_and_run(run: Run[_T], claim: str | None = None, standby_key: str | None = None) -> _T:
    """A task that did not come through the gate acquires in its worker slot: granted at
    once, or near the head of the line (``standby``) it waits in the slot up to
    ``slot_wait_timeout``, else it parks.  ``claim``: the delivery's (default: the one the
    consumer stamped).  ``standby_key``: the gate sent it ahead to stand by (see
    :mod:`.standby`): its place names that list, where a release grants it directly."""
    request = run.task.request
    redelivered = bool((request.delivery_info or {}).get("redelivered"))
    state = WaitState.from_request(request).on_arrival(redelivered, run.partition)
    ticket = ticket_of(request.id, request.retries)
    # One claim per delivery (stamped by the consumer): a grant is only ever returned again to
    # this delivery (a call re-sent by redis-py, or the gate's handoff to a place it handed
    # over), never to another delivery of the same message.
    common = common_args(run.owner, claim or delivery_claim(request), state, run.opts, run.fair)
    try:
        attempt = _first_attempt(run, state, ticket, common, standby_key)
    except SemaphoreBackendError as exc:
        # Fail closed: no permit, no body.  Come back later; nothing is lost.
        log_unavailable(run.task, run.sem, exc)
        attempt = park(run, state, ticket, common, registered=False)
    if attempt.permit is not None:
        return hold(run, attempt.permit, state)
    if attempt.status is AttemptStatus.HELD_ELSEWHERE and state.takeover:
        attempt = _take_over(run, state, ticket, common, attempt)
        if attempt.permit is not None:
            return hold(run, attempt.permit, state)
    if attempt.status is AttemptStatus.NOT_QUEUED:
        # a standby stood down: no place is kept for a copy the broker may deliver late
        attempt = park(run, state, ticket, common, registered=False)
        if attempt.permit is not None:
            return hold(run, attempt.permit, state)
    if attempt.status is AttemptStatus.WAITING:
        attempt = park(run, state, ticket, common, registered=True)
        if attempt.permit is not None:
            return hold(run, attempt.permit, state)
    if attempt.status in REFUSED:  # a bounded line (max_waiting): the task's policy
        on_full(run.task, run.sem, attempt, run.on_full)
    return drop_duplicate(run.task, run.sem, attempt, state)


def _first_attempt(
    run: Run[Any],
    state: WaitState,
    ticket: str,
    common: dict[str, Any],
    standby_key: str | None,
) -> Attempt:
    """Ask (or stand by, when the gate sent it ahead), then wait in the slot if it is near
    the head of the line.  Raises SemaphoreBackendError when Redis fails (or the semaphore is
    in quarantine): the caller parks, fail closed."""
    sem, opts = run.sem, run.opts
    quarantine_guard(sem)
    if standby_key is not None and isinstance(sem, Semaphore):
        attempt = stand_by(run.task, sem, ticket, common, opts, standby_key)
    else:
        attempt = ask(sem, ticket, state, place_ttl=opts.slot_wait_timeout + PLACE_SLACK, **common)
    standby = opts.slot_waiters if opts.slot_waiters is not None else sem.limit
    if standby_key is not None:
        pass  # it stood by: granted, or it parks now
    elif (
        attempt.status is AttemptStatus.WAITING
        and opts.slot_wait_timeout > 0
        and (attempt.position or 0) < standby
    ):
        attempt = _wait_in_slot(run, ticket, common, attempt)
    check_grant(sem, attempt, ticket, common["claim"])
    return attempt


def _wait_in_slot(run: Run[Any], ticket: str, common: dict[str, Any], attempt: Attempt) -> Attempt:
    """Wait in the slot (woken by the release that grants it) up to ``slot_wait_timeout``."""
    task, sem, opts = run.task, run.sem, run.opts
    # keep_place: when the wait ends without a grant, the place stays for park
    emit_waited(sem, task.request.id, task.name, "slot", attempt.position)
    log_wait.info(
        "task %s waits in a slot of its worker (limit %d, position %s) for up to %.1fs "
        "(slot_wait_timeout)",
        task.name,
        sem.limit,
        attempt.position,
        opts.slot_wait_timeout,
        semaphore=sem.name,
        task_id=task.request.id,
    )
    return sem.wait(
        ticket,
        timeout=opts.slot_wait_timeout,
        place_ttl=IN_SLOT_PLACE_TTL,  # refreshed every poll while it waits
        keep_place=PLACE_SLACK,
        **common,
    )


def _take_over(
    run: Run[Any], state: WaitState, ticket: str, common: dict[str, Any], attempt: Attempt
) -> Attempt:
    """Our previous delivery holds the ticket's permit.  If it ran on this machine and its
    process is gone (SIGKILL with reject_on_worker_lost: Celery tells nobody), take the
    permit back now; otherwise wait until it releases (this copy then finds the ticket done
    and drops) or its lease expires (this copy then runs)."""
    sem = run.sem
    try:
        quarantine_guard(sem)
        if _reclaim_from_dead_process(sem, ticket):
            again = sem.try_acquire(ticket, place_ttl=PLACE_SLACK, **common)
            # a grant made on a lost state is given back, and raises: this copy then parks
            check_grant(sem, again, ticket, common["claim"])
            attempt = again
    except SemaphoreBackendError as exc:
        log_unavailable(run.task, sem, exc)
    if attempt.permit is None:
        attempt = park(run, state, ticket, common, registered=False)
    return attempt


def _reclaim_from_dead_process(sem: Lock, token: str) -> bool:
    """Release ``token``'s permit when the process holding it ran where this one can see it
    (same machine, same PID namespace) and is gone; under the claim that process held, so a
    permit granted meanwhile to another delivery is never touched."""
    holder = next((h for h in sem.holders() if h.token == token), None)
    if holder is None:
        return False
    here = host_owner(None, "", "")
    owner = holder.owner
    if owner.get("machine") != here["machine"] or owner.get("pidns", "") != here["pidns"]:
        return False  # another host, or a container that shares our hostname only
    pid, claim = owner.get("pid"), owner.get("claim")
    if not isinstance(claim, str) or not claim:
        return False  # no claim to release under: its lease brings the permit back
    if not isinstance(pid, int) or pid == os.getpid() or _process_alive(pid):
        return False
    log_release.warning(
        "released the permit of dead process %d (token %s) for its redelivery",
        pid,
        token,
        semaphore=sem.name,
        task_id=task_id_of(token),
    )
    # no tombstone: the redelivery runs
    released = sem.release_token(token, claim=claim, tombstone_ttl=0)
    if released:  # ops: events
        events.emit(
            "reclaimed", name=sem.name, count=1, reason="crashed", task_id=task_id_of(token)
        )
    return released


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
