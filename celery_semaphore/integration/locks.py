"""The lock one call of a limited task takes: one :class:`~celery_semaphore.Semaphore`, or for
a task that takes several at once, a :class:`GroupLock` (all or nothing, one script each time).

This module also keeps this process's semaphore objects (:func:`semaphore_for`, cached by
name and settings, a bounded number for a bounded time), tells the heartbeat which of them
this process waits on (:func:`emit_waited`, and the tasks its gates hold), and answers the
questions the gate and the body ask of a lock (is it in quarantine, was a grant made on a lost
state).

The Celery layer talks to both the same way: ``try_acquire``, ``wait``, ``acquire``,
``withdraw``, ``release_token``, ``refresh_token``, with the keyword arguments of
:func:`lock_kwargs`; a group reads as one semaphore in logs (``name`` joins the members').
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from ..core import clock
from ..core.exceptions import SemaphoreBackendError
from ..core.group import GroupPermit, SemaphoreGroup
from ..core.rates import Rate
from ..core.semaphore import HolderInfo, Permit, Semaphore
from . import config, events, family, restart, targets, wakes
from .clients import client_for
from .heartbeat import WAITED_SWEEP, heartbeat
from .spec import LimitSpec
from .targets import Plan
from .wakes import WakeRouter

__all__ = [
    "SEMAPHORE_CACHE",
    "SEMAPHORE_IDLE",
    "GroupLock",
    "Lock",
    "adopt",
    "emit_waited",
    "grant_of",
    "lock_for",
    "lock_kwargs",
    "lock_names",
    "lost_at_fence",
    "lost_at_grant",
    "member_permits",
    "quarantine_guard",
    "quarantined",
    "semaphore_for",
    "window_wait",
]

_cache_lock = threading.Lock()


class GroupLock(SemaphoreGroup):
    """A :class:`~celery_semaphore.SemaphoreGroup` with the few attributes of a semaphore the
    Celery layer logs and inspects."""

    @property
    def name(self) -> str:
        return "+".join(self.names)

    @property
    def limit(self) -> int:
        return min(sem.limit for sem, _ in self.members)

    def holders(self) -> list[HolderInfo]:
        """Every member's holders (a group grant appears once per member)."""
        return [h for sem, _ in self.members for h in sem.holders()]


Lock = Semaphore | GroupLock


def lock_kwargs(plan: Plan) -> dict[str, Any]:
    """The weight and partition arguments of the lock's try_acquire/wait/acquire."""
    if len(plan.targets) == 1:
        target = plan.targets[0]
        return {"weight": target.weight, **plan.fair(target), **plan.queueing()}
    return {
        "partition": plan.partition,
        "partition_caps": {t.name: t.partition_cap for t in plan.targets},
        "partition_weight": plan.partition_weight,
    }


def grant_of(permit: Permit) -> list[int]:
    """The fencing tokens of a grant (one per member of a group), for :func:`adopt`."""
    return [p.fencing_token for p in member_permits(permit)]


def member_permits(permit: Permit) -> Sequence[Permit]:
    return permit.permits if isinstance(permit, GroupPermit) else (permit,)


def adopt(
    lock: Lock,
    ticket: str,
    weights: Mapping[str, int],
    fencing: Sequence[int],
    expiry: float,
    claim: str,
) -> Permit:
    """The permit object for a grant made elsewhere (by the worker's gate, in another
    process): ``fencing`` as :func:`grant_of` gave it."""
    if isinstance(lock, GroupLock):
        permits = [
            Permit(sem, ticket, weight, fence, expiry, claim)
            for (sem, weight), fence in zip(lock.members, fencing, strict=True)
        ]
        return GroupPermit(lock, ticket, permits, expiry, claim)
    return Permit(lock, ticket, weights[lock.name], fencing[0], expiry, claim)


#: key -> (semaphore, last use); oldest use first.  Dynamic names ("api:{customer_id}") make
#: many semaphores: one unused for SEMAPHORE_IDLE seconds (or past SEMAPHORE_CACHE) is dropped
#: (a permit or a held task that still has it keeps it alive, and swept, until it ends).  A
#: cached semaphore costs no Redis call by itself: the heartbeat sweeps only those this
#: process holds or waits on.
_semaphores: OrderedDict[tuple[Any, ...], tuple[Semaphore, float]] = OrderedDict()
SEMAPHORE_IDLE = 600.0
SEMAPHORE_CACHE = 1000


def semaphore_for(
    app: Any,
    name: str,
    limit: int,
    lease_ttl: float,
    rates: tuple[Rate, ...] = (),
    adaptive: bool = False,
) -> Semaphore:
    """The (cached) Semaphore for ``name`` under ``app``'s settings, in this process."""
    conf = app.conf
    # one memo look-up (not three) for the parts of the key the settings give
    url, prefix, hash_tag, step, live = config.memo(conf, "semaphore_for", lambda: _key_parts(conf))
    parts = (url, prefix, hash_tag, step, live, name, limit, lease_ttl, rates, adaptive, id(app))
    key = (os.getpid(), *parts)
    now = clock.monotonic()
    with _cache_lock:
        found = _semaphores.get(key)
        if found is not None:
            _semaphores[key] = (found[0], now)
            _semaphores.move_to_end(key)
            return found[0]
    router = WakeRouter(app, name)
    sem = Semaphore(
        name,
        limit,
        redis=client_for(url, conf),
        lease_ttl=lease_ttl,
        key_prefix=prefix,
        on_wake=router,
        hash_tag=hash_tag,
        on_handoff=router.handoff,
        rate=rates or None,
        adaptive=adaptive,
        priority_step=step,
        liveness_ttl=live,
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
    return sem


def _cached_named(names: set[str]) -> list[Semaphore]:
    """This process's cached semaphores named one of ``names``."""
    pid = os.getpid()
    with _cache_lock:
        return [sem for key, (sem, _) in _semaphores.items() if key[0] == pid and sem.name in names]


def _held_by_gates() -> list[Semaphore]:
    """The semaphores the tasks held by this process's gates wait on (a source of the
    heartbeat's sweep: units freed by an expired lease reach them within a second)."""
    names: set[str] = set()
    for task in wakes.held():
        names.add(task.semaphore)
        names.update(task.semaphore.split("+"))  # a group's name joins its members'
    return _cached_named(names) if names else []


heartbeat.add_source(_held_by_gates)


def _key_parts(conf: Any) -> tuple[str, str, str | None, float, float | None]:
    """The Redis URL, key prefix, hash tag, priority step and liveness TTL of ``conf``'s
    semaphores."""
    return (
        config.redis_url_for(conf),
        config.setting(conf, "semaphore_key_prefix", "celery_semaphore"),
        config.setting(conf, "semaphore_hash_tag", None),
        config.setting(conf, "semaphore_priority_step", 60.0),
        family.liveness_ttl(conf),
    )


_groups: OrderedDict[tuple[Any, ...], GroupLock] = OrderedDict()


def lock_for(app: Any, plan: Plan, lease_ttl: float) -> Lock:
    """The lock a call takes: its one semaphore, or a group of all of them (cached)."""
    members = tuple(
        (semaphore_for(app, t.name, t.limit, lease_ttl, t.rates, t.member.adaptive), t.weight)
        for t in plan.targets
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


def lock_of_request(task: Any, spec: LimitSpec, request: Any, partition: str = "") -> Lock:
    """The lock an execution takes, worked out again from its request's arguments (in a
    process that did not run it: a dead child's parent, a dropped copy's worker)."""
    plan = targets.resolve(
        task,
        spec,
        tuple(getattr(request, "args", None) or ()),
        dict(getattr(request, "kwargs", None) or {}),
        None,
        partition=partition,
    )
    return lock_for(task.app, plan, config.resolve(task.app.conf, spec.options).lease_ttl)


def window_wait(lock: Lock, position: int, retry_after: float) -> float | None:
    """When the waiter at ``position`` in its line (0: the head) should try again by itself,
    the script having said a rate window (or a throttle pause) opens in ``retry_after``
    seconds: the head's ``count`` places at that opening, the next ``count`` one period later,
    and so on, by the slowest window (a spaced rate: each place one interval after the one
    before); so an opening window does not send every waiting task to Redis at once.  Without
    a rate (a pause), only the places the units could serve retry; None for the others, which
    a release (or a start) names."""
    rates = lock.rates if isinstance(lock, Semaphore) else ()
    if not rates:
        return retry_after if position < lock.limit else None
    spaced = [r.interval for r in rates if r.spaced]
    if spaced:  # one start per interval: each place one interval after the one before
        return retry_after + position * max(spaced)
    slowest = min(rates, key=lambda r: r.count / r.period_seconds)
    return retry_after + (position // slowest.count) * slowest.period_seconds


def lock_names(lock: Lock) -> tuple[str, ...]:
    """The semaphore names a lock covers (events are per semaphore)."""
    return lock.names if isinstance(lock, GroupLock) else (lock.name,)


#: seconds a semaphore a gate's task waits on is swept after the wait began (then the
#: gate's heartbeat source keeps it swept while the gate holds the task)
HELD_SWEEP = 1.0


def emit_waited(
    lock: Lock, task_id: str | None, task: str, mode: str, position: int | None
) -> None:
    """The ``waited`` event, once per semaphore of ``lock`` (ops: events); ``mode``: where
    the task waits (``held`` by the gate, in its ``slot``, or ``parked``).  This process's
    heartbeat sweeps those semaphores (see :meth:`.Heartbeat.waited`): for a while when the
    task waits in its slot or parks; while the gate holds it, for one held by a gate (its
    heartbeat source names them), so a task held only until a pool slot frees does not keep
    its name swept for long once it ran."""
    seconds = HELD_SWEEP if mode == "held" else WAITED_SWEEP
    for sem in _members(lock):
        heartbeat.waited(sem, seconds)
    for name in lock_names(lock):
        events.emit("waited", name=name, task_id=task_id, task=task, mode=mode, position=position)


def _members(lock: Lock) -> list[Semaphore]:
    return [sem for sem, _ in lock.members] if isinstance(lock, GroupLock) else [lock]


def quarantined(lock: Lock) -> bool:
    """Is a semaphore of ``lock`` in quarantine in this process (its state was lost)?"""
    return any(restart.quarantined(sem) for sem in _members(lock))


def quarantine_guard(lock: Lock) -> None:
    """Raise SemaphoreBackendError (the caller then waits, fail closed) while a semaphore of
    ``lock`` is in quarantine after its state was lost (see :mod:`.restart`)."""
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
    # no short cut: every member notes the fencing token it saw
    members = zip(_members(lock), grant_of(permit), strict=True)
    lost = [restart.lost_at_grant(sem, fence) for sem, fence in members]
    return any(lost)


def lost_at_fence(lock: Lock, fence: int) -> bool:
    """:func:`lost_at_grant` for a grant of one semaphore known by its fencing token (a
    handoff; a group's grants are never handed off)."""
    return isinstance(lock, Semaphore) and restart.lost_at_grant(lock, fence)
