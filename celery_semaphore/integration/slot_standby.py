"""Standby, the body's side: a task its gate sent ahead into a free slot, without a grant but
with its place and claim, waits there for the grant the gate forwards (see :mod:`.standby`).

Granted in time, it runs; not granted within ``slot_wait_timeout``, it stands down (leaves the
line, or finds a grant made to it meanwhile) and parks; revoked meanwhile, it leaves the line
and does not run; cut short (a terminate, a cold shutdown), it leaves the line first.
"""

from __future__ import annotations

from typing import Any, NoReturn

from celery.exceptions import Ignore

from .. import logs
from ..core.exceptions import SemaphoreError
from ..core.semaphore import Attempt, AttemptStatus, Semaphore
from . import config, wakes
from .asking import IN_SLOT_PLACE_TTL
from .standby import Cancelled
from .standby import wait as wait_standing_by

__all__ = ["stand_by"]

log_wait = logs.get("wait")


def stand_by(
    task: Any,
    sem: Semaphore,
    ticket: str,
    common: dict[str, Any],
    opts: config.ResolvedOptions,
    key: str,
) -> Attempt:
    """Stand by on the list ``key`` up to ``slot_wait_timeout``; not granted by then, stand
    down.  ``common``: the arguments of this delivery's attempts (its claim among them).
    Returns the grant, or the attempt that stood down (``NOT_QUEUED``: no place is kept)."""
    try:
        attempt = _stand_by(sem, ticket, opts, common, key)
        if attempt.status is AttemptStatus.WAITING:
            attempt = _stand_down(sem, ticket, common)
    except Cancelled:
        _revoked_standing_by(task, sem, ticket, common["claim"])
    except (SystemExit, KeyboardInterrupt):
        # a terminate or a cold shutdown while it stood by: no place (and no grant
        # made to it meanwhile) outlives the process
        _leave_line(task, sem, ticket, common["claim"])
        raise
    return attempt


def _leave_line(task: Any, sem: Semaphore, ticket: str, claim: str) -> None:
    """A task that stood by leaves the line without running: its place goes, and a grant a
    release made to it meanwhile (under its claim) is given back."""
    try:
        if not sem.withdraw(ticket):
            sem.release_token(ticket, claim=claim, tombstone_ttl=0, timed=False)
    except SemaphoreError as exc:
        log_wait.warning(
            "could not leave the line: %s; the place expires by itself",
            exc,
            semaphore=sem.name,
            task_id=task.request.id,
        )


def _revoked_standing_by(task: Any, sem: Semaphore, ticket: str, claim: str) -> NoReturn:
    """The task was revoked while it stood by: leave the line (giving back a grant made to it
    meanwhile, under its claim), record it as revoked, and end without running the body."""
    _leave_line(task, sem, ticket, claim)
    log_wait.info(
        "task %s: revoked while it stood by in its slot; it does not run",
        task.name,
        semaphore=sem.name,
        task_id=task.request.id,
    )
    task.backend.mark_as_revoked(task.request.id, "revoked", request=task.request)
    raise Ignore()


def _stand_by(
    sem: Semaphore,
    ticket: str,
    opts: config.ResolvedOptions,
    common: dict[str, Any],
    key: str,
) -> Attempt:
    """Wait in the slot on this delivery's own list, up to ``slot_wait_timeout``, for the grant
    the gate forwards there (see :mod:`.standby`).  The place is left as the gate made it
    (its wake data names the gate, which forwards); a poll that keeps it alive says that the
    task stands by now."""
    owner = common["owner"]
    kwargs = {
        **common,
        # takes handoffs (to its gate, which forwards them): granted under this claim, with
        # this task's own lease
        "owner": {
            **owner,
            "standby": owner.get("host", ""),
            "lease_ms": round(opts.lease_ttl * 1000),
        },
        "wake_data": wakes.gate_wake_data(key),
        "place_ttl": IN_SLOT_PLACE_TTL,  # refreshed every poll while it stands by
    }

    def ask() -> Attempt:
        return sem.try_acquire(ticket, **kwargs)

    # no call yet: the gate's last attempt put the place in line (its wait was counted then)
    first = Attempt(AttemptStatus.WAITING, limit=sem.limit)
    return wait_standing_by(
        sem,
        ticket,
        common["claim"],
        key,
        {sem.name: int(common.get("weight", 1))},
        first,
        ask,
        opts.slot_wait_timeout,
    )


def _stand_down(sem: Semaphore, ticket: str, common: dict[str, Any]) -> Attempt:
    """A standby not granted in time leaves the line in one call, under its claim: a grant
    made to it meanwhile is its own (run it); else its place goes at once (NOT_QUEUED), and
    the units it stood in front of go to the next in line."""
    return sem.try_acquire(ticket, place_ttl=0, **common)
