"""What every step of a limited task's body shares: the call it runs (:class:`Run`), the
arguments each of its delivery's attempts carries (one claim per delivery: see
:mod:`.body`), and the ways it ends without running (timed out, or a duplicate).

The steps themselves are in :mod:`.gated` (run with the gate's grant), :mod:`.slot` (acquire
in the worker slot, wait there), :mod:`.slot_standby` (stand by in the slot for the gate's
grant), :mod:`.park` (leave the slot, keep the place) and :mod:`.hold` (run holding the
permit, release it on every way out).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, NoReturn, TypeVar

from celery.exceptions import Ignore

from .. import logs
from ..core.exceptions import SemaphoreTimeout
from ..core.semaphore import Attempt, AttemptStatus
from . import config, events
from .delivery import task_id_of
from .locks import Lock, lock_names, lost_at_grant, quarantine_guard
from .wait_state import WaitState, copy_of_execution

__all__ = [
    "IN_SLOT_PLACE_TTL",
    "PLACE_SLACK",
    "Run",
    "ask",
    "check_grant",
    "common_args",
    "drop_duplicate",
    "log_unavailable",
    "timeout",
]

#: seconds a parked waiter's place outlives its countdown, to cover broker delivery delays
PLACE_SLACK = 30.0
#: a place in line kept by a task waiting in its slot (it refreshes it every poll_interval)
IN_SLOT_PLACE_TTL = 5.0

log_acquire = logs.get("acquire")
log_wait = logs.get("wait")

_T = TypeVar("_T")


@dataclass(frozen=True)
class Run(Generic[_T]):
    """One call of a limited task's body in a worker slot (or eagerly): ``call`` runs the
    body; ``sem`` is the lock of this call's targets, asked with the ``fair`` arguments
    (weight, partition) and ``owner`` metadata; ``partition`` is the line it waits in."""

    task: Any
    sem: Lock
    opts: config.ResolvedOptions
    owner: dict[str, Any]
    call: Callable[[], _T]
    fair: dict[str, Any]
    partition: str
    #: what the task does when its line is full (see :mod:`.full`)
    on_full: str = "wait"


def common_args(
    owner: dict[str, Any] | None,
    claim: str,
    state: WaitState,
    opts: config.ResolvedOptions,
    fair: dict[str, Any],
) -> dict[str, Any]:
    """The try_acquire arguments every attempt of one delivery shares."""
    return {
        **fair,
        # the claim in the owner too: a release for a dead process names the claim it held
        "owner": None if owner is None else {**owner, "claim": claim},
        "claim": claim,
        "epoch": state.epoch,
        "check_done": copy_of_execution(state),
        "new_execution": not copy_of_execution(state),
        "lease_ttl": opts.lease_ttl,
    }


def ask(sem: Lock, ticket: str, state: WaitState, **kwargs: Any) -> Attempt:
    """``try_acquire`` for a copy of an execution; when the ticket is held under the claim of
    a delivery that parked a copy of it (see :attr:`WaitState.claim_before` and
    ``claims_earlier``), that grant was made to a place or a call nobody holds any more: give
    it back and ask again."""
    attempt = sem.try_acquire(ticket, **kwargs)
    parked = state.parked_claims()
    if attempt.status is not AttemptStatus.HELD_ELSEWHERE or not parked:
        return attempt
    for claim in parked:  # at most one holds it; the newest is the likeliest
        if sem.release_token(ticket, claim=claim, tombstone_ttl=0, timed=False):
            log_acquire.info(
                "gave back a grant made to this task's place after its previous copy parked",
                semaphore=sem.name,
                task_id=task_id_of(ticket),
            )
            break
    # Ask again whatever the release answered: a reply lost on the wire makes redis-py send
    # the call again, and the second finds nothing to release (False) although the first
    # did.  Held under another live copy's claim, the ticket stays HELD_ELSEWHERE.
    return sem.try_acquire(ticket, **kwargs)


def check_grant(lock: Lock, attempt: Attempt, ticket: str, claim: str) -> None:
    """A new grant made on a state that was lost (see restart.lost_at_grant) is given back
    at once, and the caller waits as if Redis had failed (fail closed)."""
    if attempt.status is not AttemptStatus.GRANTED or attempt.permit is None:
        return
    if lost_at_grant(lock, attempt.permit):
        lock.release_token(ticket, claim=claim, tombstone_ttl=0, timed=False)
        quarantine_guard(lock)


def log_unavailable(task: Any, sem: Lock, exc: Exception) -> None:
    """Fail closed: no permit, no body; the task comes back later and nothing is lost."""
    log_acquire.warning(
        "task %s: semaphore unavailable (%s); retrying later without running",
        task.name,
        exc,
        semaphore=sem.name,
        task_id=task.request.id,
    )


def timeout(task: Any, sem: Lock, waited: float, bound: float) -> SemaphoreTimeout:
    """The error of a task that waited ``waited`` seconds, past ``bound``; told to events
    and the log."""
    for name in lock_names(sem):  # ops: events
        events.emit("timed_out", name=name, task_id=task.request.id, task=task.name, waited=waited)
    log_wait.info(
        "task %s gave up after waiting %.1fs (max wait %ss): SemaphoreTimeout",
        task.name,
        waited,
        bound,
        semaphore=sem.name,
        task_id=task.request.id,
    )
    return SemaphoreTimeout(
        f"task {task.name}[{task.request.id}] waited {waited:.1f}s for semaphore "
        f"{sem.name!r} (limit {sem.limit}) and gave up (max wait {bound}s)",
        name=sem.name,
        limit=sem.limit,
        waited=waited,
    )


def drop_duplicate(task: Any, sem: Lock, attempt: Attempt, state: WaitState) -> NoReturn:
    """Drop this delivery: another delivery of its ticket holds the permit (or, for a copy of
    an execution, already ran it).  A copy of an execution (parked, woken, redelivered) is
    dropped quietly; a first delivery only when a message with the same task id runs right
    now (sending one id twice at once dedupes), and that is logged as a warning."""
    if copy_of_execution(state):
        log_acquire.info(
            "task %s: this copy is a duplicate (%s); dropped, the other copy runs (or ran) "
            "the task",
            task.name,
            attempt.status.name,
            semaphore=sem.name,
            task_id=task.request.id,
        )
    else:
        log_acquire.warning(
            "task %s: another message with task id %s holds the permit right now (%s); this "
            "one is dropped as a duplicate of it (a task id sent again later runs again)",
            task.name,
            task.request.id,
            attempt.status.name,
            semaphore=sem.name,
            task_id=task.request.id,
        )
    raise Ignore()
