"""A grant the gate makes as the worker stops is given back at once, not left to its lease.

Found by the warm-shutdown chaos test: a body that finishes during a warm shutdown releases
its unit; the release wakes the gate, which grants the unit to a held task and asks the hub to
hand it to the pool, but the hub has stopped, so the hand-over never runs and the unit stayed
held until its lease ran out (then the redelivered message waited for it too).

Here the gate runs in this process on a real Redis, in front of a stand-in for the consumer
whose hub has stopped: ``call_soon`` keeps the callbacks and never runs them (until the test
does, to check that a late hand-over does nothing).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.concurrency.base import BasePool
from celery.worker import state

from celery_semaphore import limited
from celery_semaphore.integration.gate import Gate
from celery_semaphore.integration.locks import semaphore_for
from celery_semaphore.ops.testing import RedisServer
from tests.integration.workers import wait_until

from .gate_stubs import Request, StoppedConsumer, gate_app

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(60)]


@pytest.fixture
def app(redis_server: RedisServer) -> Iterator[Celery]:
    with gate_app(redis_server, "gate-stop") as a:
        yield a


def _started_gate(consumer: StoppedConsumer) -> tuple[Gate, list[Any]]:
    """A gate in front of ``consumer``, started, and the list of what it gives the pool."""
    dispatched: list[Any] = []

    def _process_task(req: Any) -> None:  # Celery's name for it (see ToPool.direct)
        dispatched.append(req)

    gate = Gate(consumer, _process_task, hold=10)
    gate.start()
    return gate, dispatched


def test_a_grant_not_handed_over_before_stop_is_released(app: Celery) -> None:
    @app.task(bind=True, name="gate_stop.limited", shared=False)  # not on other apps
    @limited("main", limit=1, lease_ttl=60)
    def job(self: Any) -> None:
        pass

    consumer = StoppedConsumer(app)
    gate, dispatched = _started_gate(consumer)
    sem = semaphore_for(app, "main", 1, 60.0)
    blocker = sem.try_acquire("blocker")
    assert blocker.permit is not None
    req = Request(job)
    state.task_reserved(req)  # what Celery's strategy does before on_task_request
    try:
        assert gate.on_task_request(req) is None
        assert gate.held() == [f"{req.id}:0"]  # waiting in the gate
        blocker.permit.release()  # wakes the gate in this process: it grants at once
        blocker_hold = sem.inspect().hold_time_avg
        assert blocker_hold is not None
        wait_until(lambda: consumer.soon, 10, what="the gate asked the hub to hand it over")
        assert [h.owner["task_id"] for h in sem.holders()] == [req.id]
    finally:
        gate.stop()
        state.task_ready(req)
    assert sem.holders() == []  # given back at stop, not after the 60 s lease
    # a grant given back unused is no hold time: the average is still the blocker's
    assert sem.inspect().hold_time_avg == blocker_hold
    for fn, args in consumer.soon:  # a hub that runs them after all: nothing is dispatched
        fn(*args)
    assert dispatched == []


def test_stop_does_not_wait_for_the_gate_threads_tick(
    app: Celery, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate thread blocks in a pop on its wake list between ticks; ``stop()`` ends that
    wait at once (a no-op item on the list) instead of letting the worker's shutdown sit out
    the rest of the tick.  With a 30 s tick, the thread must be gone when ``stop()`` returns
    (``stop()`` gives it 5 s; without the interrupt it would still be blocked)."""
    import celery_semaphore.integration.gate.timing as gate_timing

    monkeypatch.setattr(gate_timing, "TICK", 30.0)

    @app.task(name="gate_stop.tick", shared=False)
    @limited("tick", limit=1)
    def job() -> None:
        pass

    client = redis_server.client(0)
    try:
        before = int(client.info("clients")["blocked_clients"])
        gate = Gate(StoppedConsumer(app), lambda req: None, hold=10)
        gate.start()
        thread = gate.gate_thread.thread
        assert thread is not None
        wait_until(
            lambda: int(client.info("clients")["blocked_clients"]) > before,
            10,
            what="the gate thread blocks in its pop",
        )
        gate.stop()
        assert not thread.is_alive(), "stop() returned while the gate thread still waited"
    finally:
        client.close()


def test_a_grant_the_pool_never_started_is_given_back_once_the_pool_stopped(
    app: Celery,
) -> None:
    """A grant handed to the pool stays through stop() (the pool may still start the job),
    and goes back once the pool has stopped without starting it (a prefork pool drops the
    jobs it has not started at stop); a job that started keeps its grant (its body releases)."""

    @app.task(bind=True, name="gate_stop.limited2", shared=False)
    @limited("main2", limit=2, lease_ttl=60)
    def job(self: Any) -> None:
        pass

    consumer = StoppedConsumer(app)
    pool = SimpleNamespace(_state=BasePool.RUN, TERMINATE=BasePool.TERMINATE)
    consumer.pool = pool
    gate, dispatched = _started_gate(consumer)
    sem = semaphore_for(app, "main2", 2, 60.0)
    dropped, started = Request(job), Request(job)
    try:
        for req in (dropped, started):
            state.task_reserved(req)
            assert gate.on_task_request(req) is None
        wait_until(lambda: len(consumer.soon) == 2, 10, what="both granted on arrival")
        for fn, args in consumer.soon:  # the hub hands both to the pool
            fn(*args)
        assert dispatched == [dropped, started]
        started.time_start = 1.0  # a child accepted it (Request.on_accepted)
        gate.stop()
        assert sorted(h.owner["task_id"] for h in sem.holders()) == sorted([dropped.id, started.id])
        gate.after_pool_stopped(pool)  # still running: it may start the job yet
        assert len(sem.holders()) == 2
        pool._state = BasePool.TERMINATE
        gate.after_pool_stopped(pool)
        assert [h.owner["task_id"] for h in sem.holders()] == [started.id]
    finally:
        gate.stop()
        for req in (dropped, started):
            state.task_ready(req)
        sem.release_token(f"{started.id}:0")
    assert sem.holders() == []
