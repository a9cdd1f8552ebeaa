"""What happens when a limited task runs: acquire, wait or park, hold, release.

**The invariant: one claim per delivery.**  Every Redis operation made on behalf of a task
delivery (acquire, refresh, release, withdraw, give-back, the release for a dead process)
carries that delivery's claim, and a script refuses to act on a grant held under another
claim.  The worker's consumer stamps each delivery of a limited task with its claim
(:data:`CLAIM_KEY`, see :func:`delivery_claim`); the gate, the body's wrapper in the pool and
the parent's release for a dead child all use that one.  Places in line belong to the
execution (the ticket): a place handed on to another delivery goes with its claim.

Both public forms, :func:`~celery_semaphore.limited` and
:class:`~celery_semaphore.LimitedTask`, end up in :func:`run_limited`, which wraps the task body
(``call``) in a ``try/finally``.  That is the one place that sees every exit of the body
(success, exception, ``self.retry()``, ``Ignore``, ``Reject``, soft time limit, ``SystemExit``
from a terminate or cold shutdown), unlike ``after_return``, which Celery skips for RETRY,
IGNORED and REJECTED.  Deaths the child cannot see (hard time limit, SIGKILL, OOM) are handled
in the parent by :mod:`celery_semaphore.signals`.

In a worker, a limited task normally reaches the body already holding its permit: the worker's
gate (:mod:`celery_semaphore.gate`) acquired it, holding the task in the consumer while it
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
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from kombu.utils import json as kombu_json

from . import clock, config, connection, events, logs, queues, restart, targets, wakes, worker_hooks
from .exceptions import LeaseLost, SemaphoreBackendError, SemaphoreError, SemaphoreTimeout
from .heartbeat import heartbeat
from .locks import GroupLock, Lock, adopt, lock_kwargs, member_permits
from .semaphore import Attempt, AttemptStatus, Permit, Semaphore
from .spec import LimitSpec

__all__ = [
    "CLAIM_KEY",
    "GATE_HEADER",
    "HEADER",
    "QUEUE_KEY",
    "WaitState",
    "checkpoint",
    "client_for",
    "current_permits",
    "delivery_claim",
    "host_owner",
    "gate_nonce",
    "handled_here",
    "lock_for",
    "note_handled",
    "push_to_gate",
    "quarantine_guard",
    "register_gate",
    "run_limited",
    "semaphore_for",
    "unregister_gate",
]

HEADER = "semaphore_wait"
#: the request key in which the worker's consumer tells the body which queue the message came
#: from (it knows the AMQP consumer tag; a pool process does not); never a message header
QUEUE_KEY = "semaphore_queue"
#: the request key in which the worker-side gate hands its grant to the body (never a message
#: header: the gate strips it from incoming messages)
GATE_HEADER = "semaphore_gate"
#: the request key in which the worker's consumer gives each delivery of a limited task its
#: claim (``{"n": <worker nonce>, "c": <claim>}``): every Redis call made for that delivery,
#: in the pool or in the consumer, carries it; never a message header (the consumer stamps
#: it on every limited request, over anything a message brought)
CLAIM_KEY = "semaphore_claim"
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

_handled_lock = threading.Lock()
_handled: OrderedDict[str, None] = OrderedDict()


def note_handled(token: str) -> None:
    """Record that this process ran ``token``'s body (and so released it itself)."""
    with _handled_lock:
        _handled[token] = None
        while len(_handled) > 10_000:
            _handled.popitem(last=False)


def handled_here(token: str) -> bool:
    with _handled_lock:
        return token in _handled


@dataclass(frozen=True)
class WaitState:
    """The ``semaphore_wait`` header: how this copy of the task has waited so far."""

    epoch: int = 0
    waits: int = 0
    first_wait: float | None = None
    #: this copy continues a redelivered execution whose permit may still be held by the
    #: previous delivery (alive past a visibility timeout, or dead until its lease expires)
    takeover: bool = False
    #: the partition this execution waits in (fixed at its first attempt)
    partition: str | None = None

    @classmethod
    def from_request(cls, request: Any) -> WaitState:
        headers = getattr(request, "headers", None) or {}
        raw = headers.get(HEADER) if isinstance(headers, Mapping) else None
        if raw is None:
            raw = getattr(request, HEADER, None)
        return cls.from_headers(raw, request.retries or 0)

    @classmethod
    def from_headers(cls, raw: Any, retries: int) -> WaitState:
        """From the ``semaphore_wait`` header's value (``raw``) of an execution with
        ``retries``; a header from another attempt (the user's ``self.retry()`` copies
        headers) is void."""
        if not isinstance(raw, Mapping) or raw.get("r") != retries:
            return cls()
        first = raw.get("t0")
        partition = raw.get("p")
        return cls(
            epoch=int(raw.get("e", 0)),
            waits=int(raw.get("n", 0)),
            first_wait=float(first) if first is not None else None,
            takeover=bool(raw.get("o")),
            partition=partition if isinstance(partition, str) else None,
        )

    def header(self, retries: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "r": retries,
            "e": self.epoch,
            "n": self.waits,
            "t0": self.first_wait,
            "o": 1 if self.takeover else 0,
        }
        if self.partition is not None:
            out["p"] = self.partition
        return out


# -- per-process semaphore objects -----------------------------------------------------------

_cache_lock = threading.Lock()
_clients: dict[tuple[int, str, int], Any] = {}
#: key -> (semaphore, last use); oldest use first.  Dynamic names ("api:{customer_id}") make
#: many semaphores: one unused for SEMAPHORE_IDLE seconds (or past SEMAPHORE_CACHE) is dropped
#: and no longer swept by this process.
_semaphores: OrderedDict[tuple[Any, ...], tuple[Semaphore, float]] = OrderedDict()
SEMAPHORE_IDLE = 600.0
SEMAPHORE_CACHE = 1000


def client_for(url: str, conf: Any = None) -> Any:
    """This process's redis-py client for ``url`` (one connection pool per process), made by
    :mod:`.connection` with ``conf``'s ``semaphore_redis_cluster`` and ``_options``."""
    key = (os.getpid(), url, id(conf))
    with _cache_lock:
        client = _clients.get(key)
        if client is None:
            if conf is None:
                client = connection.redis_client(url)
            else:
                s = config.redis_settings(conf)
                client = connection.redis_client(s.url, cluster=s.cluster, options=s.options)
            _clients[key] = client
        return client


def semaphore_for(app: Any, name: str, limit: int, lease_ttl: float) -> Semaphore:
    """The (cached) Semaphore for ``name`` under ``app``'s settings, in this process."""
    conf = app.conf
    url = config.redis_url_for(conf)
    prefix = config.setting(conf, "semaphore_key_prefix", "celery_semaphore")
    hash_tag = config.setting(conf, "semaphore_hash_tag", None)
    key = (os.getpid(), url, prefix, hash_tag, name, limit, lease_ttl, id(app))
    now = clock.monotonic()
    with _cache_lock:
        found = _semaphores.get(key)
        if found is not None:
            _semaphores[key] = (found[0], now)
            _semaphores.move_to_end(key)
            return found[0]
    redispatcher = _Redispatcher(app, name)
    sem = Semaphore(
        name,
        limit,
        redis=client_for(url, conf),
        lease_ttl=lease_ttl,
        key_prefix=prefix,
        on_wake=redispatcher,
        hash_tag=hash_tag,
        on_handoff=redispatcher.handoff,
    )
    with _cache_lock:
        sem = _semaphores.setdefault(key, (sem, now))[0]
        dropped = []
        while _semaphores:
            oldest_key, (oldest, used) = next(iter(_semaphores.items()))
            if len(_semaphores) <= SEMAPHORE_CACHE and now - used < SEMAPHORE_IDLE:
                break
            del _semaphores[oldest_key]
            dropped.append(oldest)
    restart.configure(
        sem,
        str(conf.get("semaphore_restart_policy", "fail_closed")),
        conf.get("semaphore_restart_quarantine", None),
    )
    for old in dropped:
        heartbeat.unwatch(old)
    heartbeat.watch(sem)
    return sem


_groups: OrderedDict[tuple[Any, ...], GroupLock] = OrderedDict()


def lock_for(app: Any, plan: targets.Plan, lease_ttl: float) -> Lock:
    """The lock a call takes: its one semaphore, or a group of all of them (cached)."""
    members = tuple(
        (semaphore_for(app, t.name, t.limit, lease_ttl), t.weight) for t in plan.targets
    )
    if len(members) == 1:
        return members[0][0]
    key = (os.getpid(), members)
    with _cache_lock:
        group = _groups.get(key)
        if group is not None:
            _groups.move_to_end(key)
            return group
    group = GroupLock(members)
    with _cache_lock:
        group = _groups.setdefault(key, group)
        while len(_groups) > SEMAPHORE_CACHE:
            _groups.popitem(last=False)
    return group


def lock_names(lock: Lock) -> tuple[str, ...]:
    """The semaphore names a lock covers (events are per semaphore)."""
    return lock.names if isinstance(lock, GroupLock) else (lock.name,)


def emit_waited(
    lock: Lock, task_id: str | None, task: str, mode: str, position: int | None
) -> None:
    """The ``waited`` event, once per semaphore of ``lock`` (ops: events); ``mode``: where
    the task waits (``held`` by the gate, in its ``slot``, or ``parked``)."""
    for name in lock_names(lock):
        events.emit("waited", name=name, task_id=task_id, task=task, mode=mode, position=position)


class _Redispatcher:
    """``on_wake`` for the Celery layer: units were freed for a waiter that is not blocked in
    this process.  Its wake data says where it waits: ``@<key>``, held by a worker's gate
    (wake that gate: directly when it runs in this process, else by pushing the ticket onto
    its wake list); else a parked task's wake copy, published now."""

    def __init__(self, app: Any, name: str) -> None:
        self.app = app
        self.name = name  # the semaphore's, for the log

    def __call__(self, ticket: str, data: str) -> None:
        if data.startswith("@"):
            key = data[1:]
            gate = _gates.get(key)
            if gate is not None and gate.pid == os.getpid():
                gate.wake(ticket)
                return
            push_to_gate(self.app, key, wakes.wake_item(ticket))
            return
        from celery.canvas import Signature

        sig = Signature.from_dict(kombu_json.loads(data), app=self.app)  # type: ignore[no-untyped-call]
        sig.apply_async()
        log_wait.info(
            "woken: re-dispatched the parked task now (ticket %s)",
            ticket,
            semaphore=self.name,
            task_id=ticket.rpartition(":")[0],
        )

    def handoff(self, ticket: str, data: str, fence: int, expires_at: float, claim: str) -> None:
        """A release granted ``ticket`` its units under ``claim`` (see
        ``Semaphore(on_handoff=...)``): only a gate's held tasks take handoffs (wake data
        ``@<key>#handoff``); hand the grant to that gate, directly or through its wake list
        (see :mod:`.wakes`)."""
        key = data[1:]
        gate = _gates.get(key)
        if gate is not None and gate.pid == os.getpid():
            gate.handed(ticket, fence, expires_at, claim)
            return
        push_to_gate(self.app, key, wakes.handoff_item(ticket, fence, expires_at, claim))


def push_to_gate(app: Any, key: str, item: str) -> None:
    """Append ``item`` to a gate's wake list ``key`` (one round trip), which then lives
    :data:`GATE_WAKE_TTL` past its last push."""
    client = client_for(config.redis_url_for(app.conf), app.conf)
    pipe = client.pipeline(transaction=False)
    pipe.rpush(key, item)
    pipe.expire(key, GATE_WAKE_TTL)
    pipe.execute()


# -- the worker-side gate's registry (see celery_semaphore.gate) ------------------------------

#: seconds a gate's wake list outlives its last push (a gate that died leaves nothing behind)
GATE_WAKE_TTL = 3600
_gates: dict[str, Any] = {}
_nonce: str | None = None


def gate_nonce() -> str:
    """This worker's gate nonce: made once in the worker's main process, before the pool
    forks, so its children share it; a grant is trusted only with this nonce."""
    global _nonce
    if _nonce is None:
        _nonce = uuid.uuid4().hex
    return _nonce


def register_gate(key: str, gate: Any) -> None:
    _gates[key] = gate


def unregister_gate(key: str) -> None:
    _gates.pop(key, None)


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
    directive = _gate_directive(request)
    plan = _plan(task, spec, args, kwargs or {}, directive)
    sem = lock_for(app, plan, opts.lease_ttl)
    fair = lock_kwargs(plan)
    weights = {t.name: t.weight for t in plan.targets}
    in_worker = not (request.called_directly or request.is_eager)
    for target in plan.targets:
        if target.template is not None:  # ops: events, and the registry learns the name
            events.emit(
                "used",
                name=target.name,
                template=target.template,
                task=task.name,
                limit=target.member.limit,
                weight=target.weight,
            )
            if in_worker:
                worker_hooks.note_dynamic_name(
                    app,
                    target.name,
                    target.template,
                    task.name,
                    target.member.limit,
                    target.weight,
                    str(request.hostname or ""),
                )
    owner = host_owner(request.id, task.name, str(request.hostname or ""))
    if directive is not None:
        return _run_gated(task, sem, weights, opts, owner, directive, call, fair, plan.partition)
    if request.called_directly or request.is_eager or not request.id:
        return _run_blocking(task, sem, opts, owner, call, fair, plan.partition)
    return _acquire_and_run(task, sem, opts, owner, call, fair, plan.partition)


def host_owner(task_id: str | None, task: str, host: str) -> dict[str, Any]:
    """The owner metadata of a permit or place: the task, and where it runs (the machine and
    its PID namespace, so a process is judged dead only by a host that can see it)."""
    return {
        "task_id": task_id,
        "task": task,
        "host": host,
        "pid": os.getpid(),
        "machine": socket.gethostname(),
        "pidns": _pid_namespace(),
    }


def _pid_namespace() -> str:
    """This process's PID namespace ('pid:[4026531836]'), '' where /proc does not say."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def delivery_claim(request: Any) -> str:
    """The claim of the delivery ``request`` belongs to: the one the consumer stamped, else
    (outside a worker: eager, direct calls) a new one."""
    return stamped_claim(request) or uuid.uuid4().hex


def stamped_claim(request: Any) -> str | None:
    """The claim this worker's consumer stamped on ``request`` (a task's request context, or
    the worker's ``Request``; see :data:`CLAIM_KEY`), or None: not stamped, or stamped by
    another worker (a message may carry anything)."""
    raw = getattr(request, CLAIM_KEY, None)
    if raw is None:
        raw = (getattr(request, "request_dict", None) or {}).get(CLAIM_KEY)
    if isinstance(raw, Mapping) and _nonce is not None and raw.get("n") == _nonce:
        claim = raw.get("c")
        if isinstance(claim, str) and claim:
            return claim
    return None


def _plan(
    task: Any,
    spec: LimitSpec,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    directive: Mapping[str, Any] | None,
) -> targets.Plan:
    """This call's targets; the partition is the one the execution already waits in (the
    gate's, or the one a parked copy carries), else the delivery queue's."""
    request = task.request
    if args and args[0] is task:  # a bound task's wrapper gets self first
        args = args[1:]
    known = directive.get("p") if directive is not None else None
    if not isinstance(known, str):
        known = WaitState.from_request(request).partition
    queue = None
    if known is None and not (request.called_directly or request.is_eager):
        stamped = getattr(request, QUEUE_KEY, None)
        if isinstance(stamped, str) and stamped:
            queue = stamped
        else:
            queue = queues.delivery_queue(task.app, request.delivery_info)
    return targets.resolve(task, spec, args, kwargs, queue, partition=known)


def _gate_directive(request: Any) -> Mapping[str, Any] | None:
    """What the worker's gate decided for this execution, if it came through the gate: only
    a directive carrying this worker's nonce and this execution's ticket counts."""
    raw = getattr(request, GATE_HEADER, None)
    if not isinstance(raw, Mapping) or _nonce is None or raw.get("n") != _nonce:
        return None
    if raw.get("t") != f"{request.id}:{request.retries or 0}":
        return None
    return raw


def _run_gated(
    task: Any,
    sem: Lock,
    weights: Mapping[str, int],
    opts: config.ResolvedOptions,
    owner: dict[str, Any],
    directive: Mapping[str, Any],
    call: Callable[[], _T],
    fair: dict[str, Any],
    partition: str,
) -> _T:
    """The gate held this task and decided: run with its grant, park, or time out."""
    request = task.request
    state = WaitState.from_request(request)
    ticket = str(directive["t"])
    do = directive.get("do")
    if do == "run":
        raw = directive["f"]
        fencing = [int(f) for f in raw] if isinstance(raw, list) else [int(raw)]
        permit = adopt(sem, ticket, weights, fencing, float(directive["x"]), str(directive["c"]))
        return _hold(
            task, sem, permit, opts, state, call, float(directive.get("w", 0.0)), partition
        )
    if do == "timeout":
        waited = float(directive.get("w", 0.0))
        raise _timeout(task, sem, waited, opts.max_wait or 0.0)
    # "park": held too long for the broker; re-publish with a countdown, keep the place.  The
    # gate handed this delivery's place over with its claim: a grant a release handed off to
    # it meanwhile is found here as its own.
    first = state.first_wait if state.first_wait is not None else time.time()
    state = WaitState(state.epoch, state.waits, first, state.takeover, partition)
    common = _common(owner, str(directive["c"]), state, opts, fair)
    attempt = _park(task, sem, state, opts, ticket, common, registered=True)
    if attempt.permit is not None:
        return _hold(task, sem, attempt.permit, opts, state, call, partition=partition)
    return _drop_duplicate(task, sem, attempt, state)


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
        "lease_ttl": opts.lease_ttl,
    }


def copy_of_execution(state: WaitState) -> bool:
    """Is this delivery a copy of an execution that may have run already (a parked or woken
    copy, a redelivery)?  Only such a copy is dropped when it finds its ticket done (a
    tombstone).  A first delivery is a new request, even with a task id used before (an id
    reused for a later send, ``report-user-42``, runs again)."""
    return state.epoch > 0 or state.takeover


def _run_blocking(
    task: Any,
    sem: Lock,
    opts: config.ResolvedOptions,
    owner: dict[str, Any],
    call: Callable[[], _T],
    fair: dict[str, Any],
    partition: str,
) -> _T:
    """Eager mode and direct calls: a Retry would recurse, so block for a bounded time."""
    bound = opts.max_wait
    if bound is None:
        bound = float(task.app.conf.get("semaphore_eager_timeout", 10.0))
    started = clock.monotonic()
    permit = sem.acquire(timeout=bound, owner=owner, **fair)
    if permit is None:
        raise _timeout(task, sem, clock.monotonic() - started, bound)
    return _hold(task, sem, permit, opts, WaitState(), call, partition=partition)


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
) -> _T:
    """A task that did not come through the gate acquires in its worker slot: granted at
    once, or near the head of the line (``standby``) it waits in the slot up to
    ``wait_timeout``, else it parks."""
    request = task.request
    state = WaitState.from_request(request)
    redelivered = bool((request.delivery_info or {}).get("redelivered"))
    if state.first_wait is None or redelivered:
        # the wait (for max_wait) starts with this first attempt; a redelivery may have to wait
        # for its previous delivery's permit
        state = WaitState(
            state.epoch,
            state.waits,
            state.first_wait or time.time(),
            takeover=state.takeover or redelivered,
        )
    state = WaitState(state.epoch, state.waits, state.first_wait, state.takeover, partition)
    ticket = f"{request.id}:{request.retries or 0}"
    # One claim per delivery (stamped by the consumer): a grant is only ever returned again to
    # this delivery (a call re-sent by redis-py, or the gate's handoff to a place it handed
    # over), never to another delivery of the same message.
    common = _common(owner, delivery_claim(request), state, opts, fair)
    try:
        quarantine_guard(sem)
        attempt = sem.try_acquire(ticket, place_ttl=opts.wait_timeout + PLACE_SLACK, **common)
        standby = opts.standby if opts.standby is not None else sem.limit
        if (
            attempt.status is AttemptStatus.WAITING
            and opts.wait_timeout > 0
            and (attempt.position or 0) < standby
        ):
            # keep_place: when the wait ends without a grant, the place stays for _park
            emit_waited(sem, request.id, task.name, "slot", attempt.position)
            log_wait.info(
                "task %s waits in its worker slot (limit %d, position %s) for up to %.1fs "
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
        return _hold(task, sem, attempt.permit, opts, state, call, partition=partition)
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
            return _hold(task, sem, attempt.permit, opts, state, call, partition=partition)
    if attempt.status is AttemptStatus.WAITING:
        attempt = _park(task, sem, state, opts, ticket, common, registered=True)
        if attempt.permit is not None:
            return _hold(task, sem, attempt.permit, opts, state, call, partition=partition)
    return _drop_duplicate(task, sem, attempt, state)


def _members(lock: Lock) -> list[Semaphore]:
    return [sem for sem, _ in lock.members] if isinstance(lock, GroupLock) else [lock]


def quarantined(lock: Lock) -> bool:
    """Is a semaphore of ``lock`` in quarantine in this process (its state was lost)?"""
    return any(restart.quarantined(sem) for sem in _members(lock))


def quarantine_guard(lock: Lock) -> None:
    """Raise SemaphoreBackendError (the caller then waits, fail closed) while a semaphore of
    ``lock`` is in quarantine after its state was lost (see :mod:`celery_semaphore.restart`)."""
    for sem in _members(lock):
        left = restart.quarantined(sem)
        if left:
            raise SemaphoreBackendError(
                f"semaphore {sem.name!r}: its state in Redis was lost; no new permit for "
                f"{left:.1f}s more (semaphore_restart_policy='fail_closed')",
                name=sem.name,
            )


def lost_at_grant(lock: Lock, permit: Permit) -> bool:
    """Was this new grant made on a state that was lost (any member's, for a group)?"""
    fences = [p.fencing_token for p in member_permits(permit)]
    # no short cut: every member notes the fencing token it saw
    lost = [restart.lost_at_grant(sem, f) for sem, f in zip(_members(lock), fences, strict=True)]
    return any(lost)


def lost_at_fence(lock: Lock, fence: int) -> bool:
    """:func:`lost_at_grant` for a grant of one semaphore known by its fencing token (a
    handoff; a group's grants are never handed off)."""
    return isinstance(lock, Semaphore) and restart.lost_at_grant(lock, fence)


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
        task_id=token.rpartition(":")[0],
    )
    # no tombstone: the redelivery runs
    released = sem.release_token(token, claim=claim, tombstone_ttl=0)
    if released:  # ops: events
        events.emit(
            "reclaimed", name=sem.name, count=1, reason="crashed", task_id=token.rpartition(":")[0]
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
    later = WaitState(epoch, state.waits + 1, first, state.takeover, state.partition)
    headers = {
        k: v for k, v in dict(request.headers or {}).items() if k not in (HEADER, GATE_HEADER)
    }
    sig = task.signature_from_request(request, headers={**headers, HEADER: later.header(retries)})
    if registered:
        # the wake copy says so: units are reserved for it, so it needs a worker slot now
        wake_data = _wake_data(task, request, headers, {**later.header(retries), "w": 1})
        try:
            quarantine_guard(sem)
            attempt = sem.try_acquire(
                ticket,
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
    else:
        position = None
    sig.apply_async(countdown=countdown)
    emit_waited(sem, request.id, task.name, "parked", position)
    log_wait.info(
        "task %s waits (limit %d, position %s, waited %.1fs): parked for %.2fs (wait #%d)",
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
            task_id=ticket.rpartition(":")[0],
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
    waited: float | None = None,
    partition: str | None = None,
) -> _T:
    permit._cs_policy = opts.on_lease_lost  # type: ignore[attr-defined]
    heartbeat.register(permit, interval=opts.heartbeat_interval, task_id=task.request.id)
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
    finally:
        permits.remove(permit)
        heartbeat.unregister(permit)
        # a ticket that parked may have other copies in flight: remember it long enough that
        # they find it done and drop themselves
        tomb = None
        if interrupted:
            # cut short (cold shutdown, terminate): the execution did not finish, so nothing
            # may report it done; an acks_late message comes back and must run
            tomb = 0.0
        elif state.epoch > 0 or state.takeover:
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
