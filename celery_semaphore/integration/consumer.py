"""The consumer's side of a worker: a bootstep that puts the gate (:mod:`.gate`) in front of
the pool, or, when the gate is off, stamps each limited request with its delivery's claim and
queue (:func:`~.delivery.stamp_delivery`) on its way to the pool."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import bootsteps

from . import config
from .delivery import CLAIM_KEY, QUEUE_KEY, gate_nonce, stamp_delivery
from .gate import Gate

__all__ = ["GateStep", "install"]


class _QueueStamp:
    """``on_task_request`` without a gate: stamp limited requests with their claim and
    queue."""

    def __init__(self, consumer: Any, dispatch: Callable[[Any], Any]) -> None:
        self.consumer = consumer
        self.dispatch = dispatch
        self.limited: dict[str, bool] = {}
        # made now, in the worker's main process before the pool forks, so its children know
        # the stamps it makes (see delivery.stamped_claim)
        gate_nonce()

    def __call__(self, req: Any) -> Any:
        from .decorators import spec_of

        name = req.task.name
        if name not in self.limited:
            self.limited[name] = spec_of(req.task) is not None
        if self.limited[name]:
            stamp_delivery(req, self.consumer.app, self.consumer)
        else:
            req.request_dict.pop(QUEUE_KEY, None)
            req.request_dict.pop(CLAIM_KEY, None)
        return self.dispatch(req)


class GateStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer bootstep wrapping ``on_task_request`` with a :class:`Gate` (or, when the gate
    is off, with the queue stamp alone)."""

    label = "celery-semaphore gate"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.gate: Gate | None = None
        hold = config.APP_SETTINGS["semaphore_worker_hold"][0]
        hold = int(c.app.conf.get("semaphore_worker_hold", hold))
        green = bool(getattr(c.pool, "is_green", False))
        if (getattr(c, "hub", None) is None and not green) or hold <= 0:
            # no event loop to hand requests back on (and a pool that needs one), or no gate
            # wanted: the body acquires, knowing its queue
            c.on_task_request = _QueueStamp(c, c.on_task_request)
            return
        self.gate = Gate(c, c.on_task_request, hold)
        c.on_task_request = self.gate.on_task_request

    def start(self, c: Any) -> None:
        if self.gate is not None:
            self.gate.start()

    def stop(self, c: Any) -> None:
        if self.gate is not None:
            self.gate.stop()

    def terminate(self, c: Any) -> None:
        self.stop(c)

    def shutdown(self, c: Any) -> None:
        # the worker's last call, after its pool stopped: grants handed to the pool for jobs
        # it dropped at stop go back now (see Gate.after_pool_stopped)
        self.stop(c)
        if self.gate is not None:
            self.gate.after_pool_stopped(getattr(c, "pool", None))


def install(app: Any) -> None:
    """Add the gate to ``app``'s consumer (idempotent); called at ``worker_init``."""
    steps = app.steps["consumer"]
    if GateStep not in steps:
        steps.add(GateStep)
