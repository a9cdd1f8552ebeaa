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
(``call``) in a ``try/finally``.  That is the one place that sees every exit of the body
(success, exception, ``self.retry()``, ``Ignore``, ``Reject``, soft time limit, ``SystemExit``
from a terminate or cold shutdown), unlike ``after_return``, which Celery skips for RETRY,
IGNORED and REJECTED.  Deaths the child cannot see (hard time limit, SIGKILL, OOM) are handled
in the parent by :mod:`celery_semaphore.integration.signals`.

In a worker, a limited task normally reaches the body already holding its permit: the worker's
gate (:mod:`.gate`) acquired it, holding the task in the consumer while it
waited, and passed the grant in the request; the wrapper adopts it (no round trip) and releases
it in the ``finally``.  A task that did not come through a gate (``semaphore_worker_hold = 0``,
a pool without an event loop) acquires here, in its slot::

    worker A: task T arrives ──► try_acquire(ticket "T-id:0")  → WAITING, position 3
              position < standby → wait in the slot (BLPOP on T's wake list) up to
              wait_timeout → still WAITING → park: keep the place (epoch 1, wake data = a copy
              of T), publish T again with countdown = backoff, ack (Ignore).  Slot is free.
    worker B: a holder releases ──► the release script names T (its units are now T's) ─►
              B publishes T's wake copy at once (no countdown).
    worker A/B: the first copy of T to arrive is granted (same ticket, so the same place);
              the other copy later finds the ticket held or done and is dropped.

Tickets are ``<task id>:<retries>``, so the user's own ``self.retry()`` is a new execution with
a new place, while semaphore waits keep ``retries`` (and so ``max_retries``) untouched.  The
wait state travels in the ``semaphore_wait`` message header, merged into the other headers.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, NoReturn, TypeVar

from celery.exceptions import Reject
from kombu.utils import json as kombu_json

from .. import logs
from ..core import clock
from ..core.exceptions import LeaseLost, SemaphoreBackendError, SemaphoreError, SemaphoreTimeout
from ..core.semaphore import Attempt, AttemptStatus, Permit, Semaphore
from . import config, events, queues, targets, wakes
from .delivery import (
    CLAIM_CHAIN,
    GATE_HEADER,
    HEADER,
    QUEUE_KEY,
    Directive,
    WaitState,
    copy_of_execution,
    delivery_claim,
    host_owner,
    note_handled,
    task_id_of,
    ticket_of,
)
from .heartbeat import heartbeat
from .locks import (
    Lock,
    adopt,
    emit_waited,
    lock_for,
    lock_kwargs,
    lock_names,
    lost_at_grant,
    member_permits,
    quarantine_guard,
    window_wait,
)
from .spec import LimitSpec
from .standby import Cancelled
from .standby import wait as wait_standing_by

__all__ = ["checkpoint", "current_permits", "release_with_retry", "run_limited"]

#: seconds a parked waiter held by a rate window comes back after the window opens
PARK_RATE_SLACK = 0.05
#: seconds a parked waiter's place outlives its countdown, to cover broker delivery delays
PLACE_SLACK = 30.0
#: a parked waiter is re-woken (another copy published) at most this often
PARKED_WAKE_GRACE = 5.0
#: a place in line kept by a task waiting in its slot (it refreshes it every poll_interval)
IN_SLOT_PLACE_TTL = 5.0

log_acquire = logs.get("acquire")
log_wait = logs.get("wait")
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


# -- the main path ----------------------------------------------------------------------------


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
    if directive is not None:
        return _run_gated(task, sem, weights, opts, owner, directive, call, fair, plan.partition)
    if request.called_directly or request.is_eager or not request.id:
        return _run_blocking(task, sem, opts, owner, call, fair)
    return _acquire_and_run(task, sem, opts, owner, call, fair, plan.partition)


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
    return targets.resolve(task, spec, args, kwargs, queue, partition=known)


def _run_gated(
    task: Any,
    sem: Lock,
    weights: Mapping[str, int],
    opts: config.ResolvedOptions,
    owner: dict[str, Any],
    directive: Directive,
    call: Callable[[], _T],
    fair: dict[str, Any],
    partition: str,
) -> _T:
    """The gate held this task and decided: run with its grant, park, or time out."""
    request = task.request
    state = WaitState.from_request(request)
    ticket = directive.ticket
    if directive.do == "run":
        permit = adopt(
            sem, ticket, weights, directive.fencing, directive.expires_at, directive.claim
        )
        if _still_held(permit, directive, opts):
            return _hold(task, sem, permit, opts, state, call, directive.waited, fair, owner)
        # the grant lapsed before the pool started it: ask again, as this same delivery
        return _acquire_and_run(task, sem, opts, owner, call, fair, partition, directive.claim)
    if directive.do == "timeout":
        raise _timeout(task, sem, directive.waited, opts.max_wait or 0.0)
    if directive.do == "standby" and isinstance(sem, Semaphore) and directive.wake:
        # sent ahead near the head of the line: wait here for the release to grant it
        return _acquire_and_run(
            task, sem, opts, owner, call, fair, partition, directive.claim, directive.wake
        )
    # "park": held too long for the broker; re-publish with a countdown, keep the place.  The
    # gate handed this delivery's place over with its claim: a grant a release handed off to
    # it meanwhile is found here as its own.
    first = state.first_wait if state.first_wait is not None else time.time()
    state = replace(state, first_wait=first, partition=partition)
    common = _common(owner, directive.claim, state, opts, fair)
    attempt = _park(task, sem, state, opts, ticket, common, registered=True)
    if attempt.permit is not None:
        return _hold(task, sem, attempt.permit, opts, state, call, None, fair, owner)
    return _drop_duplicate(task, sem, attempt, state)


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


def _common(
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


def _run_blocking(
    task: Any,
    sem: Lock,
    opts: config.ResolvedOptions,
    owner: dict[str, Any],
    call: Callable[[], _T],
    fair: dict[str, Any],
) -> _T:
    """Eager mode and direct calls: a Retry would recurse, so block for a bounded time."""
    bound = opts.max_wait
    if bound is None:
        bound = float(task.app.conf.get("semaphore_eager_timeout", 10.0))
    started = clock.monotonic()
    permit = sem.acquire(timeout=bound, owner=owner, **fair)
    if permit is None:
        raise _timeout(task, sem, clock.monotonic() - started, bound)
    return _hold(task, sem, permit, opts, WaitState(), call, None, fair, owner)


def _timeout(task: Any, sem: Lock, waited: float, bound: float) -> SemaphoreTimeout:
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


def _acquire_and_run(
    task: Any,
    sem: Lock,
    opts: config.ResolvedOptions,
    owner: dict[str, Any],
    call: Callable[[], _T],
    fair: dict[str, Any],
    partition: str,
    claim: str | None = None,
    standby_key: str | None = None,
) -> _T:
    """A task that did not come through the gate acquires in its worker slot: granted at
    once, or near the head of the line (``standby``) it waits in the slot up to
    ``wait_timeout``, else it parks.  ``claim``: the delivery's (default: the one the
    consumer stamped).  ``standby_key``: the gate sent it ahead to stand by (see
    :mod:`.standby`): its place names that list, where a release grants it directly."""
    request = task.request
    redelivered = bool((request.delivery_info or {}).get("redelivered"))
    state = WaitState.from_request(request).on_arrival(redelivered, partition)
    ticket = ticket_of(request.id, request.retries)
    # One claim per delivery (stamped by the consumer): a grant is only ever returned again to
    # this delivery (a call re-sent by redis-py, or the gate's handoff to a place it handed
    # over), never to another delivery of the same message.
    common = _common(owner, claim or delivery_claim(request), state, opts, fair)
    try:
        quarantine_guard(sem)
        if standby_key is not None and isinstance(sem, Semaphore):
            try:
                attempt = _stand_by(sem, ticket, opts, common, standby_key)
            except Cancelled:
                _revoked_standing_by(task, sem, ticket, common["claim"])
            except (SystemExit, KeyboardInterrupt):
                # a terminate or a cold shutdown while it stood by: no place (and no grant
                # made to it meanwhile) outlives the process
                _leave_line(task, sem, ticket, common["claim"])
                raise
        else:
            attempt = _ask(sem, ticket, state, place_ttl=opts.wait_timeout + PLACE_SLACK, **common)
        standby = opts.standby if opts.standby is not None else sem.limit
        if standby_key is not None:
            pass  # it stood by: granted, or it parks now
        elif (
            attempt.status is AttemptStatus.WAITING
            and opts.wait_timeout > 0
            and (attempt.position or 0) < standby
        ):
            # keep_place: when the wait ends without a grant, the place stays for _park
            emit_waited(sem, request.id, task.name, "slot", attempt.position)
            log_wait.info(
                "task %s waits in a slot of its worker (limit %d, position %s) for up to %.1fs "
                "(wait_timeout)",
                task.name,
                sem.limit,
                attempt.position,
                opts.wait_timeout,
                semaphore=sem.name,
                task_id=request.id,
            )
            attempt = sem.wait(
                ticket,
                timeout=opts.wait_timeout,
                place_ttl=IN_SLOT_PLACE_TTL,  # refreshed every poll while it waits
                keep_place=PLACE_SLACK,
                **common,
            )
        _check_grant(sem, attempt, ticket, common["claim"])
    except SemaphoreBackendError as exc:
        # Fail closed: no permit, no body.  Come back later; nothing is lost.
        _log_unavailable(task, sem, exc)
        attempt = _park(task, sem, state, opts, ticket, common, registered=False)
    if attempt.permit is not None:
        return _hold(task, sem, attempt.permit, opts, state, call, None, fair, owner)
    if attempt.status is AttemptStatus.HELD_ELSEWHERE and state.takeover:
        # Our previous delivery holds the ticket's permit.  If it ran on this machine and its
        # process is gone (SIGKILL with reject_on_worker_lost: Celery tells nobody), take the
        # permit back now; otherwise wait until it releases (this copy then finds the ticket
        # done and drops) or its lease expires (this copy then runs).
        try:
            quarantine_guard(sem)
            if _reclaim_from_dead_process(sem, ticket):
                attempt = sem.try_acquire(ticket, place_ttl=PLACE_SLACK, **common)
                _check_grant(sem, attempt, ticket, common["claim"])
        except SemaphoreBackendError as exc:
            _log_unavailable(task, sem, exc)
        if attempt.permit is None:
            attempt = _park(task, sem, state, opts, ticket, common, registered=False)
        if attempt.permit is not None:
            return _hold(task, sem, attempt.permit, opts, state, call, None, fair, owner)
    if attempt.status is AttemptStatus.WAITING:
        attempt = _park(task, sem, state, opts, ticket, common, registered=True)
        if attempt.permit is not None:
            return _hold(task, sem, attempt.permit, opts, state, call, None, fair, owner)
    return _drop_duplicate(task, sem, attempt, state)


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
    from celery.exceptions import Ignore

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
    """Wait in the slot on this delivery's own list, up to ``wait_timeout``, for the grant
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
        opts.wait_timeout,
    )


def _ask(sem: Lock, ticket: str, state: WaitState, **kwargs: Any) -> Attempt:
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


def _check_grant(lock: Lock, attempt: Attempt, ticket: str, claim: str) -> None:
    """A new grant made on a state that was lost (see restart.lost_at_grant) is given back
    at once, and the caller waits as if Redis had failed (fail closed)."""
    if attempt.status is not AttemptStatus.GRANTED or attempt.permit is None:
        return
    if lost_at_grant(lock, attempt.permit):
        lock.release_token(ticket, claim=claim, tombstone_ttl=0, timed=False)
        quarantine_guard(lock)


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


def _drop_duplicate(task: Any, sem: Lock, attempt: Attempt, state: WaitState) -> NoReturn:
    """Drop this delivery: another delivery of its ticket holds the permit (or, for a copy of
    an execution, already ran it).  A copy of an execution (parked, woken, redelivered) is
    dropped quietly; a first delivery only when a message with the same task id runs right
    now (sending one id twice at once dedupes), and that is logged as a warning."""
    from celery.exceptions import Ignore

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


def _park(
    task: Any,
    sem: Lock,
    state: WaitState,
    opts: config.ResolvedOptions,
    ticket: str,
    common: dict[str, Any],
    *,
    registered: bool,
) -> Attempt:
    """Free the worker slot: keep the place, publish a copy with a countdown, ack this one.

    Returns only when the permit was granted in the meantime; otherwise raises ``Ignore`` (or
    ``SemaphoreTimeout`` past ``max_wait``)."""
    from celery.exceptions import Ignore

    request = task.request
    now = time.time()
    first = state.first_wait if state.first_wait is not None else now
    waited = now - first
    if opts.max_wait is not None and waited >= opts.max_wait:
        _withdraw_quietly(sem, ticket)
        raise _timeout(task, sem, waited, opts.max_wait)
    countdown = _backoff(task, opts, state.waits)
    if opts.max_wait is not None:
        countdown = min(countdown, max(0.0, opts.max_wait - waited) + 0.05)
    retries = request.retries or 0
    epoch = state.epoch + 1
    # the copy knows this delivery's claim: a handoff made to the place under it after this
    # copy left (its place could not be told while Redis failed) is the copy's to take back
    later = replace(
        state,
        epoch=epoch,
        waits=state.waits + 1,
        first_wait=first,
        claim_before=common["claim"],
        claims_earlier=state.parked_claims()[: CLAIM_CHAIN - 1],
    )
    headers = {
        k: v for k, v in dict(request.headers or {}).items() if k not in (HEADER, GATE_HEADER)
    }
    sig = task.signature_from_request(request, headers={**headers, HEADER: later.header(retries)})
    if registered:
        # the wake copy says so: units are reserved for it, so it needs a worker slot now
        wake_data = _wake_data(task, request, headers, {**later.header(retries), "w": 1})
        try:
            quarantine_guard(sem)
            attempt = _ask(
                sem,
                ticket,
                state,
                place_ttl=countdown + max(PLACE_SLACK, opts.lease_ttl),
                wake_data=wake_data,
                wake_grace=PARKED_WAKE_GRACE,
                **{**common, "epoch": epoch},
            )
            _check_grant(sem, attempt, ticket, common["claim"])
        except SemaphoreBackendError as exc:
            # Fail closed: park on the countdown alone (the copy keeps the ticket, so the
            # place, if it still exists); never fail the task for a Redis blip.
            _log_unavailable(task, sem, exc)
            position = None
        else:
            if attempt.permit is not None:
                return attempt  # a unit came free meanwhile: run now
            if attempt.status is not AttemptStatus.WAITING:
                return attempt
            position = attempt.position
            after = attempt.rate_retry_after
            wait = None if after is None else window_wait(sem, position or 0, after)
            if wait is not None:
                # held by a rate window: nobody releases when it opens, so come back then
                countdown = min(countdown, wait + PARK_RATE_SLACK)
    else:
        position = None
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
    raise Ignore()


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


def _waited(state: WaitState) -> float:
    return time.time() - state.first_wait if state.first_wait else 0.0


def _hold(
    task: Any,
    sem: Lock,
    permit: Permit,
    opts: config.ResolvedOptions,
    state: WaitState,
    call: Callable[[], _T],
    waited: float | None,
    fair: Mapping[str, Any],
    owner: Mapping[str, Any],
) -> _T:
    """Run the body holding ``permit`` (granted with the ``fair`` and ``owner`` arguments), and
    release it on every way out."""
    permit._cs_policy = opts.on_lease_lost  # type: ignore[attr-defined]
    partition = fair.get("partition")
    heartbeat.register(
        permit,
        interval=opts.heartbeat_interval,
        task_id=task.request.id,
        reacquire={
            **fair,
            "owner": {**owner, "claim": permit.claim},
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
        semaphore=sem.name,
        task_id=task.request.id,
    )
    held_since = clock.monotonic()  # ops: events
    interrupted = False
    try:
        return call()
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
        elif state.epoch > 0 or state.takeover or _acks_late(task):
            tomb = 2 * (opts.retry_backoff_max + PLACE_SLACK + opts.lease_ttl)
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
            semaphore=sem.name,
            task_id=task.request.id,
        )


def _acks_late(task: Any) -> bool:
    """Is this execution's message acknowledged only after the body (so the broker may deliver
    it again while the body runs, or after it ends and before the ack)?"""
    acks_late = getattr(task.request, "acks_late", None)
    return bool(getattr(task, "acks_late", False) if acks_late is None else acks_late)


def _log_unavailable(task: Any, sem: Lock, exc: Exception) -> None:
    """Fail closed: no permit, no body; the task comes back later and nothing is lost."""
    log_acquire.warning(
        "task %s: semaphore unavailable (%s); retrying later without running",
        task.name,
        exc,
        semaphore=sem.name,
        task_id=task.request.id,
    )


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
