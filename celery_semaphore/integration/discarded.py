"""A parked copy that Celery discards before our code sees it gives up its place at once.

A task that waits by parking is re-published with a countdown and keeps its place in line
(see :mod:`.body`).  When that copy is revoked, or its ``expires`` passes, Celery's consumer
drops it on arrival (or when its countdown ends) and only sends ``task_revoked``: no body, no
gate.  Its place would stay in line until it expired, and the release that reserves units for
it would leave them idle for a lease.  The ``task_revoked`` handler (:mod:`.signals`) calls
:func:`leave_line` in the worker's main process: the place goes, and a grant a release made to
it meanwhile (under the claim of the delivery that parked it) is given back.
"""

from __future__ import annotations

from typing import Any

from .. import logs
from ..core.exceptions import SemaphoreError
from .decorators import spec_of
from .delivery import ticket_of
from .locks import lock_of_request
from .wait_state import WaitState

__all__ = ["leave_line"]

log = logs.get("wait")


def leave_line(task: Any, request: Any, expired: bool) -> None:
    """``request`` (a discarded copy's context) leaves its execution's place in line."""
    spec = spec_of(task)
    if spec is None or not task.app.conf.get("semaphore_enabled", True):
        return
    try:
        state = WaitState.from_request(request)
    except ValueError:  # a malformed header: it never had a place of ours
        return
    claims = state.parked_claims()
    if not claims:
        return  # not a parked copy: the gate (or nobody) had its place
    why = "its expiry passed" if expired else "it was revoked"
    try:
        lock = lock_of_request(task, spec, request, state.partition or "")
        ticket = ticket_of(request.id, getattr(request, "retries", 0))
        left = lock.withdraw(ticket) or any(
            lock.release_token(ticket, claim=c, tombstone_ttl=0, timed=False, only_now=True)
            for c in claims
        )
    except (SemaphoreError, ValueError, TypeError) as exc:
        log.warning(
            "task %s: %s while parked, and its place could not be given up: %s; it expires by "
            "itself",
            task.name,
            why,
            exc,
            semaphore=spec.name,
            task_id=getattr(request, "id", None),
        )
        return
    if left:
        log.info(
            "task %s: %s while parked; its place in line is given up",
            task.name,
            why,
            semaphore=lock.name,
            task_id=request.id,
        )
