"""The consumer's side (hub thread): ``Consumer.on_task_request``, replaced, lets a limited task
through the gate: its entry is made, it is held (counted in the prefetch window, off the pool)
and queued for its first attempt by the arrivals thread; a task whose request cannot be worked
out fails alone, in the pool."""

from __future__ import annotations

import uuid
from typing import Any

from ... import logs
from ...core.exceptions import SemaphoreBackendError, SemaphoreRequestError
from ...core.semaphore import Semaphore
from .. import config, queues, targets
from ..delivery import (
    GATE_HEADER,
    QUEUE_KEY,
    Delivery,
    Directive,
    host_owner,
    stamp_delivery,
    stamped_claim,
    ticket_of,
)
from ..locks import lock_for
from ..spec import LimitSpec
from ..wait_state import HEADER, WaitState
from . import reqs, timing
from .arrivals import Arrivals
from .dispatch import ToPool
from .entry import Entry

log = logs.get("gate")


class Hook:
    """What the gate does with each request the consumer receives."""

    def __init__(self, app: Any, to_pool: ToPool, arrivals: Arrivals, handoff_key: str) -> None:
        self.app = app
        self.to_pool = to_pool
        self.registry = to_pool.registry
        self.consumer = to_pool.consumer
        self.arrivals = arrivals
        self.key = to_pool.key
        self.handoff_key = handoff_key
        self._specs: dict[str, LimitSpec | None] = {}

    def on_task_request(self, req: Any) -> Any:
        """Replaces ``Consumer.on_task_request``: limited tasks pass through the gate."""
        spec = self._spec(req)
        # A grant travels only from this gate to its pool: never trust one a message brought.
        req.request_dict.pop(GATE_HEADER, None)
        if spec is None or not config.setting(self.app.conf, "semaphore_enabled", True):
            return self.to_pool.send(req)
        try:
            stamp_delivery(req, self.app, self.consumer)
            entry = self._entry(req, spec)
        except SemaphoreBackendError as exc:
            log.warning(
                "task %s: not gated (%s); it acquires in its slot",
                req.name,
                exc,
                semaphore=spec.name,
                task_id=req.id,
            )
            return self.to_pool.send(req)
        except Exception as exc:  # the message's or the user's callables': this task fails
            return self._fail(req, spec, exc)
        with self.registry.lock:
            if not self.registry.admit(entry):
                # another delivery of the same execution is already here: the body's wrapper
                # sorts the copies out (it refuses to run two at once)
                return self.to_pool.send(req)
        if entry.counted:
            self.consumer.qos.increment_eventually()
            reqs.unreserve(req)
        self.arrivals.push(entry)
        return None

    def _fail(self, req: Any, spec: LimitSpec, exc: Exception) -> Any:
        """What ``req`` asks for could not be worked out (a per-call callable raised, a header
        is malformed): it goes to the pool to fail there with a SemaphoreRequestError, as any
        task failure does (result, events, its message acknowledged); the worker goes on."""
        message = (
            str(exc)
            if isinstance(exc, SemaphoreRequestError)
            else (
                f"task {req.name}: what it asks of semaphore {spec.name!r} could not be worked out "
                f"for this message: {type(exc).__name__}: {exc}"
            )
        )
        log.error("%s; the task fails", message, semaphore=spec.name, task_id=req.id)
        try:
            ticket = ticket_of(req.id, int(req.request_dict.get("retries") or 0))
            fail = Directive(self.to_pool.nonce, ticket, "", "fail", "", error=message)
            req.request_dict[GATE_HEADER] = fail.to_request()
        except Exception:  # a message Celery itself cannot run: it fails its own way there
            pass
        return self.to_pool.send(req)

    def _spec(self, req: Any) -> LimitSpec | None:
        from ..decorators import spec_of

        name = req.task.name
        if name not in self._specs:
            self._specs[name] = spec_of(req.task)
        return self._specs[name]

    def _entry(self, req: Any, spec: LimitSpec) -> Entry:
        conf = self.app.conf
        opts = config.resolve(conf, spec.options)
        headers = req.request_dict
        retries = int(headers.get("retries") or 0)
        state = WaitState.from_headers(headers.get(HEADER), retries)
        queue = req.request_dict.get(QUEUE_KEY) if state.partition is None else None
        plan = targets.resolve(
            req.task,
            spec,
            req.args,
            req.kwargs,
            queue,
            partition=state.partition,
            message_priority=queues.message_priority(conf, req.delivery_info),
        )
        sem = lock_for(self.app, plan, opts.lease_ttl)
        redelivered = bool((req.delivery_info or {}).get("redelivered"))
        state = state.on_arrival(redelivered, plan.partition)
        ticket = ticket_of(req.id, retries)
        # one claim per delivery, stamped on the request: the gate's calls, the body's in the
        # pool and a release for a dead child all carry it; another delivery of the same
        # ticket never gets this one's grant
        claim = stamped_claim(req) or uuid.uuid4().hex
        # held_by: `show` and `explain` say which node holds the task, off the pool
        owner = {
            **host_owner(req.id, req.name, self.consumer.hostname),
            "claim": claim,
            "held_by": self.consumer.hostname,
        }
        if isinstance(sem, Semaphore):
            # takes handoffs (see Semaphore(on_handoff=...)): granted under its owner's claim
            wake_data = "@" + self.handoff_key
            # its own lease: the releasing task's may be shorter than this one's heartbeat
            owner.update(lease_ms=round(opts.lease_ttl * 1000))
        else:  # a group's units are granted together by its own scripts
            wake_data = "@" + self.key
        entry = Entry(req, spec, plan, sem, opts, Delivery(ticket, claim), wake_data, state, owner)
        entry.place_ttl = max(timing.HELD_PLACE_MIN, min(timing.HELD_PLACE_TTL, opts.lease_ttl))
        return entry
