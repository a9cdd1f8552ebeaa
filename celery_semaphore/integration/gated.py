"""The body of a task the worker's gate held: it carries the gate's decision (a
:class:`.delivery.Directive`) and acts on it.

``run``: the gate's grant is adopted (no round trip) and the body runs holding it, unless the
grant lapsed before the pool started it (then it asks again, as the same delivery).
``timeout``: it fails with SemaphoreTimeout.  ``standby``: it stands by in its slot
(:mod:`.slot_standby`).  ``park``: held too long for the broker, it parks (:mod:`.park`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TypeVar

from .. import logs
from ..core import clock
from ..core.exceptions import SemaphoreError
from ..core.semaphore import Permit, Semaphore
from . import config
from .asking import Run, common_args, drop_duplicate, timeout
from .delivery import Directive, task_id_of
from .full import REFUSED, on_full
from .hold import hold
from .locks import adopt
from .park import park
from .slot import acquire_and_run
from .wait_state import WaitState

__all__ = ["run_gated"]

log_acquire = logs.get("acquire")

_T = TypeVar("_T")


def run_gated(run: Run[_T], directive: Directive, weights: Mapping[str, int]) -> _T:
    """The gate held this task and decided: run with its grant (``weights``: the units it
    holds of each semaphore), park, stand by, or time out."""
    task, sem, opts = run.task, run.sem, run.opts
    state = WaitState.from_request(task.request)
    ticket = directive.ticket
    if directive.do == "run":
        permit = adopt(
            sem, ticket, weights, directive.fencing, directive.expires_at, directive.claim
        )
        if _still_held(permit, directive, opts):
            return hold(run, permit, state, directive.waited)
        # the grant lapsed before the pool started it: ask again, as this same delivery
        return acquire_and_run(run, directive.claim)
    if directive.do == "timeout":
        raise timeout(task, sem, directive.waited, opts.max_wait or 0.0)
    if directive.do == "standby" and isinstance(sem, Semaphore) and directive.wake:
        # sent ahead near the head of the line: wait here for the release to grant it
        return acquire_and_run(run, directive.claim, directive.wake)
    # "park": held too long for the broker; re-publish with a countdown, keep the place.  The
    # gate handed this delivery's place over with its claim: a grant a release handed off to
    # it meanwhile is found here as its own.
    first = state.first_wait if state.first_wait is not None else time.time()
    state = replace(state, first_wait=first, partition=run.partition)
    common = common_args(run.owner, directive.claim, state, opts, run.fair)
    attempt = park(run, state, ticket, common, registered=True)
    if attempt.permit is not None:
        return hold(run, attempt.permit, state)
    if attempt.status in REFUSED:  # its place was taken (keep_newest), or lapsed and full
        on_full(task, sem, attempt, run.on_full)
    return drop_duplicate(task, sem, attempt, state)


def _still_held(permit: Permit, directive: Directive, opts: config.ResolvedOptions) -> bool:
    """Is the gate's grant still this delivery's?  The gate keeps a grant's lease alive until
    the body starts, but not while Redis fails: a grant older than one heartbeat interval is
    refreshed first (under the delivery's claim), and one that is gone, or that Redis cannot
    vouch for, is not run on."""
    if clock.monotonic() - directive.granted_at < opts.heartbeat_interval:
        return True
    try:
        held = permit.refresh()
    except SemaphoreError as exc:
        log_acquire.warning(
            "the worker's grant could not be checked before the body started: %s; asking again",
            exc,
            semaphore=permit.semaphore.name,
            task_id=task_id_of(permit.token),
        )
        return False
    if not held:
        log_acquire.warning(
            "the worker's grant lapsed before the body started (its lease was not kept alive: "
            "Redis failed meanwhile); asking again",
            semaphore=permit.semaphore.name,
            task_id=task_id_of(permit.token),
        )
    return held
