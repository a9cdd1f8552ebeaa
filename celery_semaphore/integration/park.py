"""Park: free the worker slot of a task that waits, keeping its place in line.

The task is published again with a countdown (its back-off), carrying how it has waited so
far (the ``semaphore_wait`` header, see :class:`.wait_state.WaitState`), and this delivery is
acknowledged (``Ignore``).  Its place in line is kept, with a wake copy of the task: the
release that hands the units to the place publishes that copy at once, so the task does not
wait out its countdown.  Whichever copy arrives first is granted (same ticket, same place);
the other later finds the ticket held or done and is dropped.
"""

from __future__ import annotations

import random
import time
from dataclasses import replace
from typing import Any

from celery.exceptions import Ignore
from kombu.utils import json as kombu_json

from .. import logs
from ..core.exceptions import SemaphoreBackendError, SemaphoreError
from ..core.semaphore import Attempt, AttemptStatus
from . import config, parked, started
from .asking import PLACE_SLACK, Run, ask, check_grant, log_unavailable, timeout
from .delivery import GATE_HEADER, task_id_of
from .locks import Lock, emit_waited, quarantine_guard, window_wait
from .wait_state import CLAIM_CHAIN, HEADER, WaitState

__all__ = ["park"]

#: seconds a parked waiter held by a rate window comes back after the window opens
PARK_RATE_SLACK = 0.05
#: a parked waiter is re-woken (another copy published) at most this often
PARKED_WAKE_GRACE = 5.0

log_wait = logs.get("wait")

parked.install()


def park(
    run: Run[Any],
    state: WaitState,
    ticket: str,
    common: dict[str, Any],
    *,
    registered: bool,
) -> Attempt:
    """Free the worker slot: keep the place, publish a copy with a countdown, ack this one.
    ``common``: the arguments of this delivery's attempts (see :func:`.asking.common_args`);
    ``registered``: keep the place in line (with a wake copy), else park on the countdown
    alone.

    Returns only when the permit was granted in the meantime; otherwise raises ``Ignore`` (or
    ``SemaphoreTimeout`` past ``max_wait``)."""
    task, sem, opts = run.task, run.sem, run.opts
    request = task.request
    now = time.time()
    first = state.first_wait if state.first_wait is not None else now
    waited = now - first
    countdown = _countdown(run, ticket, state.waits, waited)
    retries = request.retries or 0
    later = _next_copy(state, first, common["claim"])
    headers = {
        k: v
        for k, v in dict(request.headers or {}).items()
        if k not in (HEADER, GATE_HEADER, started.EVENT_KEY)
    }
    sig = task.signature_from_request(request, headers={**headers, HEADER: later.header(retries)})
    position = None
    if registered:
        # the wake copy says so: units are reserved for it, so it needs a worker slot now
        wake_data = _wake_data(task, request, headers, {**later.header(retries), "w": 1})
        place_ttl = countdown + max(PLACE_SLACK, opts.lease_ttl)
        kwargs = {**common, "epoch": later.epoch, "place_ttl": place_ttl, "wake_data": wake_data}
        attempt = _keep_place(run, state, ticket, kwargs)
        if attempt is not None:
            if attempt.permit is not None or attempt.status is not AttemptStatus.WAITING:
                return attempt  # a unit came free meanwhile: run now (or drop, a duplicate)
            position = attempt.position
            countdown = _rate_window(sem, attempt, countdown)
    sig.apply_async(countdown=countdown)
    emit_waited(sem, request.id, task.name, "parked", position)
    log_wait.info(
        "task %s waits (limit %d, position %s, waited %.1fs): parked in the broker for %.2fs "
        "(wait #%d)",
        task.name,
        sem.limit,
        position,
        waited,
        countdown,
        later.waits,
        semaphore=sem.name,
        task_id=request.id,
    )
    parked.note(task.request.id)
    raise Ignore()


def _countdown(run: Run[Any], ticket: str, waits: int, waited: float) -> float:
    """Seconds until the parked copy comes back (its back-off, after ``waits`` waits), within
    ``max_wait``; past ``max_wait`` (``waited`` so far), the place goes and the task times
    out."""
    opts = run.opts
    if opts.max_wait is not None and waited >= opts.max_wait:
        _withdraw_quietly(run.sem, ticket)
        raise timeout(run.task, run.sem, waited, opts.max_wait)
    countdown = _backoff(run.task, opts, waits)
    if opts.max_wait is not None:
        countdown = min(countdown, max(0.0, opts.max_wait - waited) + 0.05)
    return countdown


def _next_copy(state: WaitState, first: float, claim: str) -> WaitState:
    """The wait state the parked copy carries: one wait more, in the next epoch, since
    ``first``.  The copy knows this delivery's ``claim``: a handoff made to the place under it
    after this copy left (its place could not be told while Redis failed) is the copy's to
    take back."""
    return replace(
        state,
        epoch=state.epoch + 1,
        waits=state.waits + 1,
        first_wait=first,
        claim_before=claim,
        claims_earlier=state.parked_claims()[: CLAIM_CHAIN - 1],
    )


def _keep_place(
    run: Run[Any], state: WaitState, ticket: str, kwargs: dict[str, Any]
) -> Attempt | None:
    """Ask once more, keeping the place for the parked copy (``kwargs``: the try_acquire
    arguments, its place's time to live and wake data among them); None when Redis failed."""
    try:
        quarantine_guard(run.sem)
        attempt = ask(run.sem, ticket, state, wake_grace=PARKED_WAKE_GRACE, **kwargs)
        check_grant(run.sem, attempt, ticket, kwargs["claim"])
    except SemaphoreBackendError as exc:
        # Fail closed: park on the countdown alone (the copy keeps the ticket, so the
        # place, if it still exists); never fail the task for a Redis blip.
        log_unavailable(run.task, run.sem, exc)
        return None
    return attempt


def _rate_window(sem: Lock, attempt: Attempt, countdown: float) -> float:
    """The countdown of a waiter held by a rate window: nobody releases when it opens, so it
    comes back then (if that is sooner than ``countdown``)."""
    after = attempt.rate_retry_after
    wait = None if after is None else window_wait(sem, attempt.position or 0, after)
    if wait is not None:
        return min(countdown, wait + PARK_RATE_SLACK)
    return countdown


def _wake_data(task: Any, request: Any, headers: dict[str, Any], header: dict[str, Any]) -> str:
    """The wake copy as JSON, or '' when the arguments are not JSON-serializable (then the
    task comes back on its countdown only)."""
    sig = task.signature_from_request(request, headers={**headers, HEADER: header})
    try:
        return str(kombu_json.dumps(dict(sig)))  # type: ignore[no-untyped-call]
    except (TypeError, ValueError):
        return ""


def _backoff(task: Any, opts: config.ResolvedOptions, waits: int) -> float:
    cap = opts.retry_backoff_max
    vt = config.visibility_timeout(task.app.conf)
    if vt is not None:
        cap = min(cap, vt / 2)
    ceiling = min(cap, opts.retry_backoff * (2 ** min(waits, 32)))
    return random.uniform(0, ceiling) if opts.retry_jitter else ceiling


def _withdraw_quietly(sem: Lock, ticket: str) -> None:
    try:
        sem.withdraw(ticket)
    except SemaphoreError as exc:
        log_wait.warning(
            "could not withdraw %s: %s",
            ticket,
            exc,
            semaphore=sem.name,
            task_id=task_id_of(ticket),
        )
