"""The arrivals thread looks at every held task (to make some ready for free pool slots) only
when something changed, not at every poll.

While held tasks are not ready it polls every ``READY_POLL`` (50 ms); it used to look at
every held task at each poll, under the gate's lock, even when the free slots and the held
tasks were the same as at its last look.  That work (with a Redis call for each task it made
ready) runs beside the gate's other threads and the consumer; a killed child's permit came
back late on a loaded machine (see ``test_gate_reaper``).

The gate runs in this process on a real Redis, in front of a stand-in consumer with a
one-slot pool: two tasks of one line are held, the first ready for the free slot, the second
not, and nothing changes.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from celery.worker import state

import celery_semaphore.integration.readiness as readiness
from celery_semaphore import limited
from celery_semaphore.integration.gate import Gate
from celery_semaphore.integration.heartbeat import heartbeat
from celery_semaphore.integration.locks import semaphore_for
from celery_semaphore.ops.testing import RedisServer
from tests.integration.workers import wait_until

from .gate_stubs import Request, StoppedConsumer, gate_app

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(60)]


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When the gate looked at every held task (a call of readiness.pick)."""
    seen: list[float] = []
    pick = readiness.pick

    def counted(entries: Any, free: int) -> Any:
        seen.append(time.monotonic())
        return pick(entries, free)

    monkeypatch.setattr(readiness, "pick", counted)
    return seen


def test_held_tasks_are_looked_at_again_only_when_something_changed(
    redis_server: RedisServer, looks: list[float]
) -> None:
    with gate_app(redis_server, "gate-ready-looks") as app:

        @app.task(bind=True, name="gate_ready_looks.job", shared=False, ignore_result=True)
        @limited("main", limit=1, lease_ttl=60)
        def job(self: Any) -> None:
            pass

        consumer = StoppedConsumer(app)
        consumer.pool = SimpleNamespace(num_processes=1)  # one slot, free
        gate = Gate(consumer, lambda req: None, hold=10)
        sem = semaphore_for(app, "main", 1, 60.0)
        reqs = [Request(job), Request(job)]
        gate.start()
        try:
            assert sem.try_acquire("blocker").permit is not None
            for req in reqs:
                state.task_reserved(req)  # as Celery's strategy does before on_task_request
                assert gate.on_task_request(req) is None
            wait_until(lambda: len(sem.waiters()) == 2, 10, what="both held, in line")
            assert gate.registry.not_ready() == 1  # the second waits for a slot
            time.sleep(0.5)  # settled
            before = len(looks)
            time.sleep(1.5)  # 30 polls of READY_POLL, nothing changing
            assert len(looks) - before <= 3, f"{len(looks) - before} looks in 1.5 s"
        finally:
            gate.stop()
            for req in reqs:
                state.task_ready(req)
            heartbeat.unwatch(sem)
