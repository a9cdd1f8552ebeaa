"""What happens when a limited task runs: acquire, wait or park, hold, release.

**The invariant: one claim per delivery.**  Every Redis operation made on behalf of a task
delivery (acquire, refresh, release, withdraw, give-back, the release for a dead process)
carries that delivery's claim, and a script refuses to act on a grant held under another
claim.  The worker's consumer stamps each delivery of a limited task with its claim
(see :mod:`.delivery`); the gate, the body's wrapper in the pool and the parent's release for
a dead child all use that one.  Places in line belong to the execution (the ticket): a place
handed on to another delivery goes with its claim.

Both public forms, :func:`~celery_semaphore.limited` and
:class:`~celery_semaphore.LimitedTask`, end up in :func:`run_limited`, which wraps the task body
(``call``) in a ``try/finally`` (:func:`.hold.hold`).  That is the one place that sees every
exit of the body (success, exception, ``self.retry()``, ``Ignore``, ``Reject``, soft time
limit, ``SystemExit`` from a terminate or cold shutdown), unlike ``after_return``, which Celery
skips for RETRY, IGNORED and REJECTED.  Deaths the child cannot see (hard time limit,
SIGKILL, OOM) are handled in the parent by :mod:`celery_semaphore.integration.signals`.

In a worker, a limited task normally reaches the body already holding its permit: the worker's
gate (:mod:`.gate`) acquired it, holding the task in the consumer while it
waited, and passed the grant in the request; the wrapper adopts it (no round trip) and releases
it in the ``finally``.  A task that did not come through a gate (``semaphore_worker_hold = 0``,
a pool without an event loop) acquires in its slot (:mod:`.slot`)::

    worker A: task T arrives ──► try_acquire(ticket "T-id:0")  → WAITING, position 3
              position < standby → wait in the slot (BLPOP on T's wake list) up to
              slot_wait_timeout → still WAITING → park: keep the place (epoch 1, wake data = a copy
              of T), publish T again with countdown = backoff, ack (Ignore).  Slot is free.
    worker B: a holder releases ──► the release script names T (its units are now T's) ─►
              B publishes T's wake copy at once (no countdown).
    worker A/B: the first copy of T to arrive is granted (same ticket, so the same place);
              the other copy later finds the ticket held or done and is dropped.

Tickets are ``<task id>:<retries>``, so the user's own ``self.retry()`` is a new execution with
a new place, while semaphore waits keep ``retries`` (and so ``max_retries``) untouched.  The
wait state travels in the ``semaphore_wait`` message header, merged into the other headers.

The wrapper's parts, one module each:

* :mod:`.gated`: a task the gate held acts on the gate's decision (run with its grant, park,
  stand by, or time out);
* :mod:`.slot`: a task without a grant acquires in its worker slot, and waits there near the
  head of the line; :mod:`.slot_standby`: one the gate sent ahead stands by there for the
  gate's grant;
* :mod:`.park`: a task that waits frees its slot, keeping its place;
* :mod:`.hold`: the body runs holding the permit, released on every way out;
* :mod:`.asking`: what they share (the arguments of a delivery's attempts, timing out,
  dropping a duplicate).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ..core import clock
from ..core.exceptions import SemaphoreFull, SemaphoreRequestError
from ..core.semaphore import Attempt, AttemptStatus
from . import config, events, queues, targets
from .asking import Run, timeout
from .delivery import QUEUE_KEY, Directive, host_owner
from .full import on_full
from .gated import run_gated
from .hold import checkpoint, current_permits, hold
from .locks import lock_for, lock_kwargs
from .slot import acquire_and_run
from .spec import LimitSpec
from .wait_state import WaitState

__all__ = ["checkpoint", "current_permits", "run_limited"]

_T = TypeVar("_T")


def run_limited(
    task: Any,
    spec: LimitSpec,
    call: Callable[[], _T],
    args: tuple[Any, ...] = (),
    kwargs: Mapping[str, Any] | None = None,
) -> _T:
    """Run ``call`` (the task body, called with ``args`` and ``kwargs``) while holding the
    permit of each semaphore ``spec`` names for this call."""
    app = task.app
    conf = app.conf
    if not config.setting(conf, "semaphore_enabled", True):
        return call()  # explicitly disabled (e.g. in the user's unit tests)
    request = task.request
    opts = config.resolve(conf, spec.options)
    directive = Directive.from_request(request)
    if directive is not None and directive.do == "fail":
        # the worker's gate could not work out what this call asks for (see gate.hook.Hook._fail)
        raise SemaphoreRequestError(directive.error)
    plan = _plan(task, spec, args, kwargs or {}, directive)
    sem = lock_for(app, plan, opts.lease_ttl)
    fair = lock_kwargs(plan)
    weights = {t.name: t.weight for t in plan.targets}
    for target in plan.targets:
        if target.template is not None:  # ops: events, and the registry learns the name
            events.emit(
                "used",
                name=target.name,
                template=target.template,
                task=task.name,
                # a limit per key: this name's (in code, or semaphore_limits over it)
                limit=target.member.limit if target.member.limit_by is None else target.limit,
                weight=target.weight,
            )
    owner = host_owner(request.id, task.name, str(request.hostname or ""))
    run = Run(task, sem, opts, owner, call, fair, plan.partition, plan.on_full)
    if directive is not None:
        return run_gated(run, directive, weights)
    if request.called_directly or request.is_eager or not request.id:
        return _run_blocking(run)
    return acquire_and_run(run)


def _plan(
    task: Any,
    spec: LimitSpec,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    directive: Directive | None,
) -> targets.Plan:
    """This call's targets: the gate's, as it resolved them in the consumer; else resolved
    here, in the partition the execution already waits in (a parked copy carries it), else
    the delivery queue's."""
    request = task.request
    if directive is not None and directive.plan is not None:
        try:
            sent = targets.Plan.from_wire(spec, directive.plan)
        except (KeyError, TypeError, ValueError):
            sent = None  # not a plan of this task's (a changed deployment): resolved here
        if sent is not None:
            return sent
    if args and args[0] is task:  # a bound task's wrapper gets self first
        args = args[1:]
    known = directive.partition if directive is not None else None
    if known is None:
        known = WaitState.from_request(request).partition
    queue = None
    if known is None and not (request.called_directly or request.is_eager):
        stamped = getattr(request, QUEUE_KEY, None)
        if isinstance(stamped, str) and stamped:
            queue = stamped
        else:
            queue = queues.delivery_queue(task.app, request.delivery_info)
    priority = queues.message_priority(task.app.conf, request.delivery_info)
    return targets.resolve(
        task, spec, args, kwargs, queue, partition=known, message_priority=priority
    )


def _run_blocking(run: Run[_T]) -> _T:
    """Eager mode and direct calls: a Retry would recurse, so block for a bounded time."""
    task, sem, opts = run.task, run.sem, run.opts
    bound = opts.max_wait
    if bound is None:
        bound = float(task.app.conf.get("semaphore_eager_timeout", 10.0))
    started = clock.monotonic()
    try:
        permit = sem.acquire(timeout=bound, owner=run.owner, **run.fair)
    except SemaphoreFull as exc:  # a bounded line (max_waiting): the task's policy
        status = AttemptStatus.DROPPED if exc.dropped else AttemptStatus.FULL
        on_full(task, sem, Attempt(status, limit=sem.limit), run.on_full)
    if permit is None:
        raise timeout(task, sem, clock.monotonic() - started, bound)
    return hold(run, permit, WaitState())
