"""What a task does when its limit's line is full: ``@limited(..., max_waiting=N,
on_full=...)`` (checked at decoration by ``table.check_queueing``).  :func:`on_full` ends a
task the core refused a place (``FULL``) or whose place a newer task took (``DROPPED``), by its
policy: ``fail`` raises, ``drop`` and ``keep_newest`` end it without running, visibly.
"""

from __future__ import annotations

from typing import Any, NoReturn

from celery import states
from celery.exceptions import Ignore

from .. import logs
from ..core.exceptions import SemaphoreFull
from ..core.semaphore import Attempt, AttemptStatus
from . import events
from .locks import Lock, lock_names

__all__ = ["REFUSED", "on_full"]

log = logs.get("acquire")

#: the statuses :func:`on_full` handles
REFUSED = (AttemptStatus.FULL, AttemptStatus.DROPPED)


def on_full(task: Any, sem: Lock, attempt: Attempt, policy: str) -> NoReturn:
    """End a task that was refused a place (FULL) or lost its place to a newer task
    (DROPPED): ``fail`` raises :class:`~celery_semaphore.SemaphoreFull`; otherwise the task
    ends without running, visibly (a WARNING, a ``dropped`` event, the result REVOKED)."""
    dropped = attempt.status is AttemptStatus.DROPPED
    why = (
        "its place in line was taken by a newer task (on_full='keep_newest')"
        if dropped
        else f"the line is full (max_waiting, on_full={policy!r})"
    )
    request = task.request
    if policy == "fail" and not dropped:
        raise SemaphoreFull(
            f"task {task.name}[{request.id}]: semaphore {sem.name!r} (limit {sem.limit}): "
            f"not run: {why}",
            name=sem.name,
            limit=sem.limit,
            dropped=False,
        )
    log.warning(
        "task %s[%s] dropped without running: semaphore %r: %s",
        task.name,
        request.id,
        sem.name,
        why,
        semaphore=sem.name,
        task_id=request.id,
    )
    reason = "replaced" if dropped else "full"
    for name in lock_names(sem):  # ops: events, metrics
        events.emit("dropped", name=name, task_id=request.id, task=task.name, reason=reason)
    _mark_revoked(task, f"celery-semaphore: {why}")
    raise Ignore()


def _mark_revoked(task: Any, reason: str) -> None:
    """The result state of a dropped task: REVOKED (``AsyncResult.get()`` raises
    ``TaskRevokedError``), when results are stored."""
    request = task.request
    if request.is_eager or getattr(request, "ignore_result", False) or task.ignore_result:
        return  # (eagerly, the EagerResult says IGNORED)
    try:
        task.backend.mark_as_revoked(request.id, reason, request=request, state=states.REVOKED)
    except Exception as exc:  # a backend that is down: the task still ends, logged above
        log.warning(
            "task %s[%s]: could not store its REVOKED state: %s",
            task.name,
            request.id,
            exc,
            semaphore=None,
            task_id=request.id,
        )
