"""A tiny in-process observer API: what happened to which semaphore, for metrics and the like.

The Celery layer calls :func:`emit` at a few points of a limited task's life; anything in the
same process can :func:`subscribe` to them (the Prometheus metrics of
:mod:`celery_semaphore.ops.metrics` do)::

    from celery_semaphore.integration import events

    def on_event(kind: str, fields: dict) -> None:
        if kind == "timed_out":
            alert(fields["name"], fields["task_id"])

    unsubscribe = events.subscribe(on_event)

With nobody subscribed, :func:`emit` returns at once.  Subscribers run synchronously in the
thread that emits (a task's own thread, or the heartbeat thread), so they must be quick and
must not block; an exception in one is logged and never reaches the task.  Subscriptions are
per process: made in a prefork worker's main process before the pool starts, they are
inherited by its children.

Events (``kind``, then the fields; every event has ``name``, the semaphore name):

=============  ================================================================================
``acquired``   a task got its permit: ``task_id``, ``task``, ``weight``, ``wait`` (seconds since
               this execution first asked, 0.0 for a direct/eager call), ``partition`` (the
               line it waited in: its queue by default, "" for the default partition)
``waited``     a task could not get a permit at once: ``task_id``, ``task``, ``mode`` (``"held"``:
               its worker's gate holds it, off the pool; ``"slot"``: it waits in its worker
               slot; ``"parked"``: it was re-queued with a countdown),
               ``position`` (0 is the head of the line; None when unknown)
``timed_out``  a task gave up waiting (``max_wait``, or the eager bound): ``task_id``, ``task``,
               ``waited`` (seconds)
``released``   a task gave its permit back: ``task_id``, ``task``, ``weight``, ``hold`` (seconds the
               body held it), ``held`` (False when the permit was already gone: lease lost or a
               forced release)
``lease_lost`` the heartbeat found a running task's permit gone: ``task_id``, ``token``
``reclaimed``  permits taken back from holders that could not release them: ``count``,
               ``reason`` (``"expired"``: leases that ran out, found by a worker's sweep;
               ``"crashed"``: a dead process's permit released by the worker;
               ``"process_died"``: permits of a process, or a whole worker, whose liveness
               record expired, found by a worker's sweep; ``"forced"``: a running task's
               permit released by an operator (``celery semaphore release`` or ``reset``,
               the web page), found by its heartbeat, as ``lease_lost`` is), ``task_id``
               (None for ``"expired"`` and ``"process_died"``)
``dropped``    a task ended without running because its line was full (``max_waiting`` with
               ``on_full="drop"`` or ``"keep_newest"``): ``task_id``, ``task``, ``reason``
               (``"full"``: no place for it; ``"replaced"``: a newer task took its place)
``used``       a call is about to take a semaphore whose name was made from its arguments
               (``"api:{customer_id}"``): ``template``, ``task``, ``limit`` (from the code),
               ``weight``
=============  ================================================================================
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .. import logs

__all__ = ["KINDS", "Subscriber", "emit", "subscribe", "subscribed", "unsubscribe"]

log = logs.get("events")

Subscriber = Callable[[str, dict[str, Any]], None]

#: every event kind the library emits
KINDS = frozenset(
    {"acquired", "waited", "timed_out", "released", "lease_lost", "reclaimed", "used", "dropped"}
)

# A tuple, replaced whole on (un)subscribe: emit() reads it without a lock.
_subscribers: tuple[Subscriber, ...] = ()
_lock = threading.Lock()


def subscribe(fn: Subscriber) -> Callable[[], None]:
    """Call ``fn(kind, fields)`` for every event emitted in this process from now on.

    Subscribing the same function twice has no further effect.  Returns a function that
    unsubscribes it."""
    global _subscribers
    if not callable(fn):
        raise TypeError(f"subscribe() needs a callable fn(kind, fields), got {fn!r}")
    with _lock:
        if fn not in _subscribers:
            _subscribers = (*_subscribers, fn)
    return lambda: unsubscribe(fn)


def unsubscribe(fn: Subscriber) -> None:
    """Stop calling ``fn`` (no error if it was not subscribed)."""
    global _subscribers
    with _lock:
        _subscribers = tuple(s for s in _subscribers if s != fn)


def subscribed() -> bool:
    """True when someone listens (callers can skip preparing costly fields otherwise)."""
    return bool(_subscribers)


def emit(kind: str, **fields: Any) -> None:
    """Tell every subscriber that ``kind`` happened; never raises."""
    subscribers = _subscribers
    if not subscribers:
        return
    for fn in subscribers:
        try:
            fn(kind, fields)
        except Exception:
            name, task_id = fields.get("name"), fields.get("task_id")
            log.exception(
                "celery-semaphore: event subscriber %r failed on %r",
                fn,
                kind,
                semaphore=name if isinstance(name, str) else None,
                task_id=task_id if isinstance(task_id, str) else None,
            )
