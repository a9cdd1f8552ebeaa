"""What the gate asks of a Celery request, of the worker's state and of its pool."""

from __future__ import annotations

from typing import Any


def unreserve(req: Any) -> None:
    # A held request is not waiting for a pool slot: keep it out of reserved_requests,
    # which worker_disable_prefetch counts against the pool size.
    from celery.worker import state

    state.reserved_requests.discard(req)


def in_pool(req: Any) -> bool:
    """Is ``req`` (this very request object, not just its task id: another message may reuse
    the id) reserved for the pool or running there?"""
    from celery.worker import state

    return req in state.reserved_requests or req in state.active_requests


def submit_anywhere(consumer: Any) -> bool:
    """May work be handed to this consumer's pool from any thread?  The threads pool's
    executor is thread-safe; green pools (gevent, eventlet) run every "thread" as a greenlet
    of one OS thread (and have no hub to hand work back through)."""
    from celery.concurrency.thread import TaskPool

    pool = getattr(consumer, "pool", None)
    return isinstance(pool, TaskPool) or bool(getattr(pool, "is_green", False))


def time_limited(req: Any) -> bool:
    """Has the task a time limit?  Its clock starts when the pool starts it, so it would run
    while the task stands by: such a task waits held instead."""
    soft, hard = getattr(req, "time_limits", (None, None)) or (None, None)
    task = req.task
    return bool(soft or hard or task.soft_time_limit or task.time_limit)


def maybe_revoked(req: Any) -> bool:
    """Might ``req.revoked()`` act (acknowledge, announce)?  Then it must run on the hub."""
    return bool(req.expires) or req.id in revoked()


def revoked() -> Any:
    from celery.worker.state import revoked

    return revoked


def expired(req: Any) -> bool:
    from datetime import datetime, timezone

    expires = req.expires
    return bool(expires is not None and expires <= datetime.now(timezone.utc))


def gone(req: Any) -> bool:
    """Was ``req`` revoked, or has it expired?"""
    return bool(req.id in revoked() or (req.expires and expired(req)))
