"""Run the task body holding its permit, and release it on every way out.

:func:`hold` is the ``try/finally`` around the body: the one place that sees every exit of
it (success, exception, ``self.retry()``, ``Ignore``, ``Reject``, soft time limit,
``SystemExit`` from a terminate or cold shutdown).  While the body runs, the heartbeat keeps
the permit's lease alive and :func:`current_permits` lists it for the task's own code.
"""

from __future__ import annotations

import threading
import time
from typing import Any, TypeVar

from celery.exceptions import Reject

from .. import logs
from ..core import clock
from ..core.exceptions import LeaseLost, SemaphoreBackendError
from ..core.semaphore import Permit
from . import events, started
from .asking import PLACE_SLACK, Run
from .delivery import note_handled
from .heartbeat import heartbeat
from .locks import member_permits
from .wait_state import WaitState

__all__ = ["checkpoint", "current_permits", "hold", "release_with_retry"]

log_acquire = logs.get("acquire")
log_release = logs.get("release")

_T = TypeVar("_T")
_local = threading.local()


# -- helpers for task code --------------------------------------------------------------------


def current_permits() -> list[Permit]:
    """The permits the task running in this thread holds (empty outside a limited task)."""
    return list(getattr(_local, "permits", ()))


def checkpoint() -> None:
    """Raise :class:`~celery_semaphore.LeaseLost` if a permit of the running task was lost and
    its ``on_lease_lost`` policy is ``"raise"``.  Call it between steps of long tasks."""
    for permit in current_permits():
        if permit.lost and getattr(permit, "_cs_policy", "log") == "raise":
            raise LeaseLost(
                f"semaphore {permit.semaphore.name!r}: the permit (token {permit.token}) was "
                "lost: its lease expired and another task may hold the unit",
                name=permit.semaphore.name,
                limit=permit.semaphore.limit,
                token=permit.token,
            )


# -- the body, held ---------------------------------------------------------------------------


def hold(run: Run[_T], permit: Permit, state: WaitState, waited: float | None = None) -> _T:
    """Run the body holding ``permit`` (granted with the run's ``fair`` and ``owner``
    arguments), and release it on every way out.  ``waited``: the seconds it waited (default:
    since its execution first asked, from ``state``)."""
    permits = _start(run, permit, state, waited)
    held_since = clock.monotonic()  # ops: events
    interrupted = False
    try:
        started.body_starts(run.task)  # STARTED, and the task-started event, only now
        return run.call()
    except (SystemExit, KeyboardInterrupt):
        interrupted = True
        raise
    except Reject as exc:
        interrupted = bool(exc.requeue)  # its message comes back, and must run
        raise
    finally:
        permits.remove(permit)
        heartbeat.unregister(permit)
        # Other copies of this execution may be in flight: a parked copy's siblings, a
        # redelivery of an acks_late message (a visibility timeout that ran out while the body
        # ran: that copy waits, parked, and comes back on its back-off).  Remember the ticket
        # long enough that they find it done and drop themselves.
        tomb = None
        if interrupted:
            # cut short (cold shutdown, terminate) or requeued: the execution did not finish,
            # so nothing may report it done; its message comes back and must run
            tomb = 0.0
        elif state.epoch > 0 or state.takeover or _acks_late(run.task):
            tomb = 2 * (run.opts.retry_backoff_max + PLACE_SLACK + run.opts.lease_ttl)
        _release(run, permit, tomb, held_since)


def _start(run: Run[Any], permit: Permit, state: WaitState, waited: float | None) -> list[Permit]:
    """Before the body: the heartbeat keeps the lease alive (and re-acquires it as granted),
    the task's code sees the permit; told to events and the log.  Returns this thread's list
    of held permits, which now holds ``permit``."""
    task, opts = run.task, run.opts
    permit._cs_policy = opts.on_lease_lost  # type: ignore[attr-defined]
    partition = run.fair.get("partition")
    heartbeat.register(
        permit,
        interval=opts.heartbeat_interval,
        task_id=task.request.id,
        reacquire={
            **run.fair,
            "owner": {**run.owner, "claim": permit.claim},
            "lease_ttl": opts.lease_ttl,
        },
    )
    note_handled(permit.token)
    permits: list[Permit] = _local.__dict__.setdefault("permits", [])
    permits.append(permit)
    for member in member_permits(permit):  # ops: events
        events.emit(
            "acquired",
            name=member.semaphore.name,
            task_id=task.request.id,
            task=task.name,
            weight=member.weight,
            wait=waited if waited is not None else _waited(state),
            partition=partition,
        )
    log_acquire.debug(
        "task %s acquired %d unit(s) (fencing token %d)",
        task.name,
        permit.weight,
        permit.fencing_token,
        semaphore=run.sem.name,
        task_id=task.request.id,
    )
    return permits


def _release(run: Run[Any], permit: Permit, tomb: float | None, held_since: float) -> None:
    """After the body: release ``permit`` (keeping the ticket done for ``tomb`` seconds, if
    set); told to events and the log."""
    task = run.task
    # ops: events (held =)
    held = release_with_retry(permit, tombstone_ttl=tomb, task_id=task.request.id)
    for member in member_permits(permit):  # ops: events
        events.emit(
            "released",
            name=member.semaphore.name,
            task_id=task.request.id,
            task=task.name,
            weight=member.weight,
            hold=clock.monotonic() - held_since,
            held=held,
        )
    log_release.debug(
        "task %s released its permit after %.3fs%s",
        task.name,
        clock.monotonic() - held_since,
        " (its lease had been lost)"
        if permit.lost
        else ("" if held else " (it was already gone: reclaimed or force-released)"),
        semaphore=run.sem.name,
        task_id=task.request.id,
    )


def _waited(state: WaitState) -> float:
    return time.time() - state.first_wait if state.first_wait else 0.0


def _acks_late(task: Any) -> bool:
    """Is this execution's message acknowledged only after the body (so the broker may deliver
    it again while the body runs, or after it ends and before the ack)?"""
    acks_late = getattr(task.request, "acks_late", None)
    return bool(getattr(task, "acks_late", False) if acks_late is None else acks_late)


def release_with_retry(
    permit: Permit, *, tombstone_ttl: float | None = None, task_id: str | None = None
) -> bool:
    """Release, retrying briefly on a Redis blip; then leave it to lease expiry, logged."""
    delays = (0.05, 0.2, 0.5)
    for attempt, delay in enumerate((0.0, *delays)):
        if delay:
            clock.sleep(delay)
        try:
            return permit.release(tombstone_ttl=tombstone_ttl)
        except SemaphoreBackendError as exc:
            last = exc
            log_release.warning(
                "release failed (try %d): %s",
                attempt + 1,
                exc,
                semaphore=permit.semaphore.name,
                task_id=task_id,
            )
    log_release.error(
        "could not release the permit (token %s): %s; it will come back when its lease "
        "expires (at most lease_ttl=%.0fs)",
        permit.token,
        last,
        permit.semaphore.lease_ttl,
        semaphore=permit.semaphore.name,
        task_id=task_id,
    )
    return False
