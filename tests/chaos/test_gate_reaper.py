"""The gate gives back the permit of a body whose pool child died, by itself and soon, for a
task it sent ahead to stand by as for one it granted.

Celery tells the gate of a lost child in the hub thread (its ``WorkerLostError`` failure
path), which under load came seconds late (``test_sigkill_child_mid_task`` measured 1.35 s and
2.9 s where 1 s is promised).  The gate's reaper looks at the children on its own thread; it
used to watch only the grants the gate handed to the pool, not the tasks it sent ahead to
stand by, which a release grants in their slot: for those only the hub's path was left.

Here the gate runs in this process on a real Redis in front of a stand-in consumer whose hub
runs nothing unless the test says, so Celery's own path never runs: only the reaper can give
the permit back.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery.worker import state

from celery_semaphore import limited
from celery_semaphore.core import clock
from celery_semaphore.integration.delivery import GATE_HEADER
from celery_semaphore.integration.gate import Gate
from celery_semaphore.integration.heartbeat import heartbeat
from celery_semaphore.integration.locks import semaphore_for
from celery_semaphore.ops.testing import RedisServer
from tests.integration.workers import wait_until
from tests.log_records import LogRecords, containing

from .gate_stubs import Request, StoppedConsumer, gate_app

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(60)]


@pytest.fixture
def release_log() -> Iterator[LogRecords]:
    handler = LogRecords()
    logger = logging.getLogger("celery_semaphore.release")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_standby_granted_in_its_slot_whose_child_dies_is_given_back_by_the_gate(
    redis_server: RedisServer, release_log: LogRecords
) -> None:
    with gate_app(redis_server, "gate-reaper") as app:
        app.conf.semaphore_worker_standby = 1

        @app.task(bind=True, name="gate_reaper.job", shared=False, ignore_result=True)
        @limited("main", limit=1, lease_ttl=60)
        def job(self: Any) -> None:
            pass

        consumer = StoppedConsumer(app)
        consumer.pool = SimpleNamespace(num_processes=4)  # a prefork pool with free slots
        pool: list[Any] = []
        gate = Gate(consumer, pool.append, hold=10)
        sem = semaphore_for(app, "main", 1, 60.0)
        req = Request(job)
        ticket = f"{req.id}:0"
        gate.start()
        try:
            assert sem.try_acquire("blocker").permit is not None
            state.task_reserved(req)  # what Celery's strategy does before on_task_request
            assert gate.on_task_request(req) is None
            wait_until(
                lambda: [w.ticket for w in sem.waiters()] == [ticket],
                10,
                what="the gate's first try put the task in line",
            )
            # the semaphore turns over on this worker: the gate sends its head ahead
            for _ in range(2):
                gate.registry.standing.turned_over("main")
            gate.attempts.ahead.stand_by("main")
            wait_until(lambda: consumer.soon, 10, what="the gate sent the task ahead")
            for fn, args in consumer.soon:
                fn(*args)
            assert [r.request_dict[GATE_HEADER]["do"] for r in pool] == ["standby"]

            # a release grants it in its slot (a handoff under its claim), and the child
            # running it dies (SIGKILL, OOM) with the hub too busy to tell anyone
            assert sem.release_token("blocker")
            assert [h.token for h in sem.holders()] == [ticket]
            req.worker_pid = _dead_pid()
            state.task_accepted(req)

            t0 = clock.monotonic()
            wait_until(lambda: not sem.holders(), 3, interval=0.01, what="the permit back")
            took = clock.monotonic() - t0
            assert took < 1.0, took
            assert release_log.count(containing("the process running it died")) == 1
        finally:
            gate.stop()
            state.task_ready(req)
            heartbeat.unwatch(sem)
