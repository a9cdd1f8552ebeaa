"""Handing a request the gate held to the pool: with the gate's directive (run with its grant,
stand by, park, time out, fail), from the hub thread; then watching it there, so that its slot
counts as free when it ends and its permit goes back when the process running it is lost."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from celery.exceptions import WorkerLostError

from ... import logs
from ...core import clock
from .. import acks, wakes
from ..delivery import GATE_HEADER, Directive, Stage
from ..wait_state import stamp_wait
from . import giveback, reqs
from .entry import Entry
from .health import Health
from .registry import Registry

log_wait = logs.get("wait")
log_release = logs.get("release")


class ToPool:
    """The gate's way to the pool (``Consumer.on_task_request``'s own call, which it
    replaced)."""

    def __init__(
        self,
        consumer: Any,
        dispatch: Callable[[Any], Any],
        registry: Registry,
        health: Health,
        key: str,
        nonce: str,
    ) -> None:
        self.consumer = consumer
        self.send = dispatch
        self.registry = registry
        self.health = health
        self.key = key
        self.nonce = nonce
        #: the pool takes work from any thread (the threads pool's executor is thread-safe),
        #: and nothing else (an autoscaler's semaphore) sits between it and the consumer
        self.direct = reqs.submit_anywhere(consumer) and getattr(dispatch, "__name__", "") == (
            "_process_task"
        )

    def hand_over(self, entry: Entry, status: str) -> None:
        """Send the request to the pool, from the hub thread (or directly, when the pool takes
        work from any thread)."""
        directive: Directive | None = None
        if status == "standby":
            directive = self.directive(
                entry, "standby", wake=wakes.standby_key(self.key, entry.claim)
            )
        elif status == "granted" and entry.grant is not None:
            waited = time.time() - entry.state.first_wait if entry.state.first_wait else 0.0
            fencing, expires_at = entry.grant
            directive = self.directive(
                entry,
                "run",
                fencing=tuple(fencing),
                expires_at=expires_at,
                waited=waited,
                granted_at=entry.granted_at,
            )
            if entry.position is not None:  # it waited
                log_wait.debug(
                    "task %s: granted after %.3fs held; to the pool",
                    entry.req.name,
                    clock.monotonic() - entry.since,
                    semaphore=entry.sem.name,
                    task_id=entry.req.id,
                )
        if self.direct and not reqs.maybe_revoked(entry.req):
            # a pool any thread may submit to (threads): one thread hop less between the
            # release and the next body
            self.dispatch(entry, directive)
        else:
            self.consumer.call_soon(self.dispatch, entry, directive)

    def directive(self, entry: Entry, do: str, **extra: Any) -> Directive:
        return Directive(
            self.nonce,
            entry.ticket,
            entry.claim,
            do,
            entry.plan.partition,
            plan=entry.plan.to_wire(),
            **extra,
        )

    def dispatch(self, entry: Entry, directive: Directive | None) -> None:
        req = entry.req
        if not self.registry.dispatching(entry):
            return  # the gate stopped and gave its grant back; the message is redelivered
        if entry.stage in (Stage.RUNNING, Stage.HANDED_OVER) and req.revoked():
            # revoked on its way: revoked() acknowledged it, and the pool would drop it; what
            # it took with it goes back (its grant, or its place and any grant to it)
            if entry.stage is Stage.RUNNING:
                self.registry.forget_pending(entry)
                giveback.release(entry, "it was revoked before it started")
            else:
                giveback.withdraw(entry, "it was revoked on its way to the pool", self.health)
            return
        self._watch_end(req)
        if directive is not None:
            req.request_dict[GATE_HEADER] = directive.to_request()
            if directive.do in ("run", "standby"):
                # a standby's grant, if a release made it before the child died, likewise
                self._watch_failure(entry)
            if directive.do == "standby":
                acks.hold_until_granted(req)
        stamp_wait(req, entry.state)
        from celery.worker import state

        state.task_reserved(req)
        try:
            self.send(req)
        except Exception:
            self.registry.forget_pending(entry)
            if directive is not None and directive.do == "run":
                giveback.release(entry, "the pool refused it")
            raise
        if directive is not None and directive.do in ("run", "standby"):
            self.registry.watch(entry)  # its child, on prefork (see .reaper)

    def _watch_end(self, req: Any) -> None:
        """When ``req`` ends in the pool, its slot is free: held tasks may be made ready."""
        on_success, on_failure = req.on_success, req.on_failure
        slot_freed = self.registry.slot_freed

        def success(*args: Any, **kwargs: Any) -> Any:
            try:
                return on_success(*args, **kwargs)
            finally:
                slot_freed()

        def failure(*args: Any, **kwargs: Any) -> Any:
            try:
                return on_failure(*args, **kwargs)
            finally:
                slot_freed()

        req.on_success, req.on_failure = success, failure

    def _watch_failure(self, entry: Entry) -> None:
        """Release in this process when the pool loses the process that ran the body (SIGKILL,
        OOM; also with ``reject_on_worker_lost``, where Celery sends no ``task_failure``)."""
        req = entry.req
        original = req.on_failure

        def on_failure(exc_info: Any, *args: Any, **kwargs: Any) -> Any:
            exc = getattr(exc_info, "exception", None)
            exc = getattr(exc, "exc", exc)  # billiard's ExceptionWithTraceback wraps it
            if isinstance(exc, WorkerLostError):
                # Before Celery's own handling, whose task_failure signal would release it
                # too (and log it a second time): that release then finds nothing held.
                # No tombstone: a redelivery (reject_on_worker_lost) must run, not drop.
                try:
                    giveback.release(
                        entry, "the process running it was lost", tombstone_ttl=0, timed=True
                    )
                except Exception as err:  # never keep Celery from handling the failure
                    log_release.error(
                        "could not release the permit of task %s: %s: %s",
                        req.name,
                        type(err).__name__,
                        err,
                        semaphore=entry.sem.name,
                        task_id=req.id,
                    )
            return original(exc_info, *args, **kwargs)

        req.on_failure = on_failure
