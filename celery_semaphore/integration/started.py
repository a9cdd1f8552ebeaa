"""What a client or Flower sees of a limited task: waiting, then started once (when its body
starts, holding its permit), then done.

Celery calls a task started when a pool child accepts it: with ``task_track_started`` its
tracer stores ``STARTED`` before the body's wrapper asks for the permit, and the worker sends
a ``task-started`` event.  A limited task may then still wait in its slot (standing by, or
waiting there without the gate), or park: re-published to wait, each copy is accepted, and
said started, again.  So:

* at worker start (``worker_init``, in the main process, before the pool's children fork),
  each limited task whose ``track_started`` is on has it turned off for Celery's tracer
  (:func:`take_over`), and the wrapper stores ``STARTED`` itself once the body holds its
  permit (:func:`body_starts`);
* a limited request received by a worker that sends task events keeps its ``task-started``
  event until its body starts (:func:`on_received`): one the gate hands to the pool with its
  grant starts at once, and Celery sends the event as usual; any other (standing by, waiting
  in its slot, parking, timing out) has it sent by the body, holding its permit.  A copy that
  parks never says it started.

Celery's own ``task-received`` event (and ``task-sent``, with ``task_send_sent_event``) is
sent for each copy of a parked task, before any code of ours sees it: a monitor sees the task
received again (still waiting), not started again.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from celery import states
from celery.app.task import get_actual_ignore_result

from .. import logs
from .delivery import GATE_HEADER, Directive

__all__ = ["EVENT_KEY", "body_starts", "on_received", "take_over"]

log = logs.get("acquire")

#: in a request's dict (never a message header): its worker held back the ``task-started``
#: event at accept; the body sends it as it starts holding its permit
EVENT_KEY = "semaphore_started_event"
#: on a limited task: Celery's tracer no longer stores STARTED for it (see take_over)
_TRACK = "_cs_track_started"
#: on a limited task: its requests keep their task-started event until the body starts
_LIMITED = "_cs_limited"


def take_over(app: Any, names: Iterable[str]) -> None:
    """(``worker_init``) the limited tasks ``names`` of ``app``: the body says when they
    start, not Celery's tracer or the pool's accept."""
    for name in names:
        task = app.tasks.get(name)
        if task is None:
            continue
        setattr(task, _LIMITED, True)
        if task.track_started:
            task.track_started = False  # read by the tracer at each call
            setattr(task, _TRACK, True)


def on_received(request: Any = None, **_: Any) -> None:
    """(``task_received``, the worker's main process) a limited request's ``task-started``
    event waits for its body (see the module's docstring)."""
    if request is None or not getattr(request.task, _LIMITED, False):
        return
    request.request_dict.pop(EVENT_KEY, None)  # never trusted from a message
    if not (_sends_task_events(getattr(request, "_eventer", None)) and request.task.send_events):
        return
    request.request_dict[EVENT_KEY] = True
    send = request.send_event

    def send_event(type: str, **fields: Any) -> Any:
        if type == "task-started" and not _starts_at_once(request.request_dict):
            return None  # its body sends it, holding its permit
        return send(type, **fields)

    request.send_event = send_event


def _sends_task_events(eventer: Any) -> bool:
    """Does the worker send task events (``-E``, ``worker_send_task_events``)?  Its dispatcher
    is enabled without them too (for worker heartbeats), limited to the ``worker`` group."""
    if eventer is None or not eventer.enabled:
        return False
    groups = getattr(eventer, "groups", None)
    return not groups or "task" in groups


def _starts_at_once(request_dict: Any) -> bool:
    """Does the gate hand this request to the pool with its grant (its body starts at once)?"""
    raw = request_dict.get(GATE_HEADER)
    return isinstance(raw, dict) and raw.get("do") == "run"


def body_starts(task: Any) -> None:
    """(The pool, the body about to run holding its permit) tell the result backend and the
    monitors, as Celery would have at accept."""
    request = task.request
    if request.is_eager or request.called_directly:
        return
    try:
        if getattr(task, _TRACK, False) and not get_actual_ignore_result(task, request):
            meta = {"pid": os.getpid(), "hostname": request.hostname}
            task.backend.store_result(request.id, meta, states.STARTED, request=request)
        if getattr(request, EVENT_KEY, False):
            directive = Directive.from_request(request)
            if directive is None or directive.do != "run":
                task.send_event("task-started")
    except Exception as exc:  # what a monitor sees never keeps the body from running
        log.warning(
            "task %s: could not say it started: %s: %s",
            task.name,
            type(exc).__name__,
            exc,
            semaphore=None,
            task_id=request.id,
        )
