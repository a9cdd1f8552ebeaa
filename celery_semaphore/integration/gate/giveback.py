"""What a held or handed-over delivery took, given back: a grant it will not use, its place
in line, or the permit of a body that will not release it itself."""

from __future__ import annotations

from ... import logs
from ...core.exceptions import SemaphoreError
from ...core.semaphore import Semaphore
from .. import events
from ..delivery import Stage
from ..locks import lock_names
from .entry import Entry
from .health import Health

log = logs.get("gate")
log_wait = logs.get("wait")
log_release = logs.get("release")


def give_back(entry: Entry, *, handoff: bool = True) -> None:
    """Release a grant ``entry`` will not use; ``handoff=False``: the units go to no
    waiter by handoff (see :func:`give_back_handoff`)."""
    sem = entry.sem
    try:
        if isinstance(sem, Semaphore) and not handoff:
            sem.release_token(
                entry.ticket, claim=entry.claim, tombstone_ttl=0, timed=False, handoff=False
            )
        else:
            sem.release_token(entry.ticket, claim=entry.claim, tombstone_ttl=0, timed=False)
    except SemaphoreError as exc:
        log.warning(
            "could not give back a grant: %s",
            exc,
            semaphore=entry.sem.name,
            task_id=entry.req.id,
        )


def give_back_handoff(entry: Entry) -> None:
    """Give back a grant a handoff may have made to ``entry`` (no longer held here); it is
    not handed off again (its place may still name this gate)."""
    if isinstance(entry.sem, Semaphore):  # a group's grants are never handed off
        give_back(entry, handoff=False)


def withdraw(entry: Entry, why: str, health: Health) -> None:
    """Take ``entry``'s place out of line, and give back a grant a release made to it
    meanwhile (under its claim)."""
    try:
        if not entry.sem.withdraw(entry.ticket):
            give_back_handoff(entry)  # a release may have granted it meanwhile
    except SemaphoreError as exc:
        health.failed()
        log_wait.warning(
            "withdraw failed (%s): %s", why, exc, semaphore=entry.sem.name, task_id=entry.req.id
        )


def release(
    entry: Entry, why: str, tombstone_ttl: float | None = None, timed: bool = False
) -> None:
    """Release for the task when its body will not release itself; ``timed`` when the
    body ran (its hold counts in the hold-time average), not when it never started."""
    try:
        # only_now: a body that released its permit before its process was reported lost
        # (or the pool dropped a finished job at stop) is no crash to log
        released = entry.sem.release_token(
            entry.ticket,
            claim=entry.claim,
            tombstone_ttl=tombstone_ttl,
            timed=timed,
            only_now=True,
        )
    except SemaphoreError as exc:
        log_release.error(
            "could not release the permit of task %s after %s: %s; it comes back when its "
            "lease expires",
            entry.req.name,
            why,
            exc,
            semaphore=entry.sem.name,
            task_id=entry.req.id,
        )
        return
    if released:
        # no tombstone, and not at stop: the process running it was lost
        if tombstone_ttl == 0 and entry.stage is not Stage.GIVEN_BACK:
            for name in lock_names(entry.sem):
                events.emit("reclaimed", name=name, count=1, reason="crashed", task_id=entry.req.id)
        log_release.warning(
            "released the permit of task %s: %s",
            entry.req.name,
            why,
            semaphore=entry.sem.name,
            task_id=entry.req.id,
        )


def at_stop(
    held: list[Entry], stranded: list[Entry], undispatched: list[Entry], standing: list[Entry]
) -> None:
    """The gate stopped (see ``Gate.stop``): the places of the tasks it held, and of those
    that left it for the pool but never got there, go (a grant a release made to one
    meanwhile goes back); grants never handed to the pool go back; the places of standbys
    go (a waiting place only: never a grant)."""
    for entry in held + stranded:
        try:
            if not entry.sem.withdraw(entry.ticket):
                give_back_handoff(entry)  # a release may have granted it meanwhile
        except SemaphoreError as exc:
            log.debug(
                "withdraw at stop failed: %s",
                exc,
                semaphore=entry.sem.name,
                task_id=entry.req.id,
            )
    for entry in undispatched:
        # no tombstone: the message was never acknowledged, and its redelivery must run
        release(entry, "the worker stopped before it started", tombstone_ttl=0)
    for entry in standing:
        try:
            entry.sem.withdraw(entry.ticket)  # a waiting place only: never a grant
        except SemaphoreError as exc:
            log.debug("withdraw at stop failed: %s", exc, semaphore=None, task_id=entry.req.id)
