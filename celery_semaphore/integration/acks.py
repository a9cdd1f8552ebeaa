"""Acknowledged only when safe: a task sent ahead to stand by in a pool slot keeps its message
unacknowledged until it is granted.

Celery acknowledges a task that is not ``acks_late`` as soon as a pool child accepts it.  A
task the gate sends ahead to stand by (see :mod:`.standby`) is accepted before it holds a
permit: were the worker's main process killed then, the message would be gone and the task
would never run.  So its accept-time acknowledgement waits: the message is acknowledged when
the gate forwards the task its grant (:func:`granted`), or when the task ends, whichever comes
first; a task that ends in any way (success, failure, retry, park) is acknowledged then, as
Celery would have done at its start.  A held task the gate sends to take its turn in a full
pool queue (see :mod:`.readiness`) asks for its permit in its slot: its acknowledgement waits for
its end.  ``acks_late`` tasks are left to Celery.
"""

from __future__ import annotations

from typing import Any

__all__ = ["granted", "hold_until_granted"]


def hold_until_granted(req: Any) -> None:
    """Before ``req`` (a Celery ``Request``) goes to the pool: its accept-time
    acknowledgement waits for :func:`granted` or for the task's end."""
    if req.task.acks_late:
        return
    req._cs_hold_ack = True
    accepted = req.on_accepted

    def on_accepted(*args: Any, **kwargs: Any) -> Any:
        if getattr(req, "_cs_granted", False):
            return accepted(*args, **kwargs)
        req.acknowledge = _not_yet  # Celery's on_accepted acknowledges: not yet
        try:
            return accepted(*args, **kwargs)
        finally:
            del req.acknowledge

    req.on_accepted = on_accepted
    for name in ("on_success", "on_failure", "on_retry"):
        setattr(req, name, _then_acknowledge(req, getattr(req, name)))


def granted(req: Any) -> None:
    """(The consumer's thread) ``req``, standing by, got its grant: acknowledge it now, if its
    acknowledgement was held (an ``acks_late`` task is acknowledged by Celery when it ends)."""
    if not getattr(req, "_cs_hold_ack", False):
        return
    req._cs_granted = True
    if "acknowledge" not in vars(req):  # not inside the accept-time call
        req.acknowledge()


def _not_yet() -> None:
    return None


def _then_acknowledge(req: Any, handler: Any) -> Any:
    def handle(*args: Any, **kwargs: Any) -> Any:
        try:
            return handler(*args, **kwargs)
        finally:
            if "acknowledge" not in vars(req):
                req.acknowledge()

    return handle
