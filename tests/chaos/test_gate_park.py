"""A task the gate has held too long is parked, and never lost when a release frees its unit
meanwhile.

Found by the clock-jump chaos test (``test_redis_faults``), once in many runs: the gate sent
two tasks it had held "too long" (the clock jumped an hour) to the pool to park; while those
park directives waited for a free slot, releases handed the freed units off to the two tickets,
granted under the gate's claim; the wrapper that parks, asking under a claim of its own, found
each ticket held elsewhere and dropped the task as a duplicate, and the gate gave the grant
back.  Nothing ran the task.

Here the gate runs in this process on a real Redis, in front of a stand-in consumer whose
hub (and so the pool) takes work only when the test says.  The release comes from a
semaphore whose wake-ups and handoffs the test delivers to the gate itself, late, the way one
crossing Redis from another process can arrive after the pool ran the park.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import Celery, states
from celery.app.trace import build_tracer
from celery.worker import state

import celery_semaphore.integration.gate.timing as gate_timing
from celery_semaphore import Semaphore, limited
from celery_semaphore.core import clock
from celery_semaphore.core.exceptions import SemaphoreBackendError
from celery_semaphore.integration.delivery import GATE_HEADER
from celery_semaphore.integration.gate import Gate
from celery_semaphore.integration.heartbeat import heartbeat
from celery_semaphore.integration.locks import semaphore_for
from celery_semaphore.ops.testing import RedisServer
from tests.integration.workers import wait_until
from tests.log_records import LogRecords, containing

from .gate_stubs import Request, StoppedConsumer, gate_app
from .proxy import Proxy

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(60)]


class Late:
    """A release's wake-ups and handoffs, kept until the test delivers them to the gate."""

    def __init__(self) -> None:
        self.woken: list[str] = []
        self.handed: list[tuple[str, int, float, str]] = []

    def on_wake(self, ticket: str, data: str) -> None:
        self.woken.append(ticket)

    def on_handoff(self, ticket: str, data: str, fence: int, expires_at: float, claim: str) -> None:
        self.handed.append((ticket, fence, expires_at, claim))

    def deliver(self, gate: Gate) -> None:
        for ticket in self.woken:
            gate.wake(ticket)
        for ticket, fence, expires_at, claim in self.handed:
            gate.handed(ticket, fence, expires_at, claim)


class Scene:
    """One limited task (limit 1) held by a gate while a blocker holds the unit."""

    def __init__(self, app: Celery, redis_server: RedisServer, **options: Any) -> None:
        self.ran: list[str] = []
        ran = self.ran

        # shared=False: not on other apps
        @app.task(bind=True, name="gate_park.job", shared=False, ignore_result=True)
        @limited("main", limit=1, lease_ttl=60, **options)
        def job(self: Any) -> None:
            ran.append(self.request.id)

        self.job = job
        self.consumer = StoppedConsumer(app)
        self.pool: list[Any] = []
        self.gate = Gate(self.consumer, self.pool.append, hold=10)
        self.sem = semaphore_for(app, "main", 1, 60.0)
        self.late = Late()
        # the same semaphore, seen from a process whose wake-ups reach the gate late
        self.elsewhere = Semaphore(
            "main",
            1,
            redis=redis_server.client(0),
            lease_ttl=60,
            key_prefix=str(app.conf.semaphore_key_prefix),
            on_wake=self.late.on_wake,
            on_handoff=self.late.on_handoff,
        )
        self.req = Request(job)
        self.ticket = f"{self.req.id}:0"

    def hold_the_task(self) -> None:
        assert self.sem.try_acquire("blocker").permit is not None
        state.task_reserved(self.req)  # what Celery's strategy does before on_task_request
        assert self.gate.on_task_request(self.req) is None
        wait_until(
            lambda: [w.ticket for w in self.sem.waiters()] == [self.ticket],
            10,
            what="the gate's first try put the task in line",
        )

    def release_the_blocker(self) -> None:
        assert self.elsewhere.release_token("blocker")

    def pool_takes_work(self) -> list[str]:
        """Run what the gate asked the hub to do; return the directives the pool got."""
        wait_until(lambda: self.consumer.soon, 10, what="the gate sent the task to the pool")
        soon, self.consumer.soon[:] = list(self.consumer.soon), []
        for fn, args in soon:
            fn(*args)
        return [str(r.request_dict[GATE_HEADER]["do"]) for r in self.pool]

    def run_the_body(self) -> bool:
        """Run the task in its pool slot, as the worker does (Celery's tracer, with the
        directive the gate put in the request); False when it was dropped."""
        (req,) = self.pool
        trace = build_tracer(self.job.name, self.job, app=self.job.app)
        request = {
            "id": req.id,
            "retries": 0,
            "hostname": self.consumer.hostname,
            "delivery_info": {},
            "headers": {},
            GATE_HEADER: req.request_dict[GATE_HEADER],
        }
        before = len(self.ran)
        _, info, _, _ = trace(req.id, [], {}, request)
        assert info is None or info.state == states.IGNORED, info
        return len(self.ran) > before


@contextmanager
def staged(
    redis_server: RedisServer, semaphore_url: str | None = None, **options: Any
) -> Iterator[Scene]:
    with gate_app(redis_server, "gate-park", semaphore_url) as app:
        s = Scene(app, redis_server, **options)
        s.gate.start()
        try:
            yield s
        finally:
            s.gate.stop()
            state.task_ready(s.req)
            heartbeat.unwatch(s.sem)  # its keys go next: its sweep would find its state lost


@pytest.fixture
def scene(redis_server: RedisServer) -> Iterator[Scene]:
    with staged(redis_server) as s:
        yield s


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[Proxy]:
    p = Proxy(redis_server.port, redis_server.host)
    yield p
    p.close()


@pytest.fixture
def gate_log() -> Iterator[LogRecords]:
    handler = LogRecords()
    logger = logging.getLogger("celery_semaphore.gate")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def _hold_too_long(monkeypatch: pytest.MonkeyPatch) -> None:
    # the next tick finds it held too long (and, at the default PARK_ANYWAY, far too long)
    monkeypatch.setattr(gate_timing, "MAX_HOLD", 0.01)


def _check_ran_once_and_nothing_left(scene: Scene, ran: bool) -> None:
    assert ran, "the task was dropped as a duplicate: nobody runs it"
    assert scene.ran == [scene.req.id]
    assert scene.sem.holders() == []
    assert scene.sem.waiters() == []


def test_a_release_while_the_park_waits_for_a_slot_lets_the_park_run_it(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    scene.hold_the_task()
    _hold_too_long(monkeypatch)
    wait_until(lambda: not scene.gate.held(), 10, what="the gate let go of the task")
    scene.release_the_blocker()  # frees the unit while the park directive waits for the pool
    assert scene.pool_takes_work() == ["park"]
    ran = scene.run_the_body()  # the park finds the unit free for it: it runs
    scene.late.deliver(scene.gate)  # the release's wake-up (or handoff) arrives after
    _check_ran_once_and_nothing_left(scene, ran)
    assert scene.late.handed == [], "a handoff granted a task that had left the gate"


def test_a_handoff_on_its_way_when_the_gate_lets_go_runs_the_task(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    scene.hold_the_task()
    scene.release_the_blocker()  # handed off to the held task; the gate hears of it late
    assert [t for t, _, _, _ in scene.late.handed] == [scene.ticket]
    _hold_too_long(monkeypatch)
    directives = scene.pool_takes_work()  # the gate finds the grant as it lets go
    ran = scene.run_the_body()
    scene.late.deliver(scene.gate)
    _check_ran_once_and_nothing_left(scene, ran)
    assert directives == ["run"]


def test_a_grant_that_lapsed_before_the_pool_started_it_is_not_run_on(scene: Scene) -> None:
    """The gate keeps a pending grant's lease alive only while Redis answers.  A grant that
    lapsed (here: taken back by force, and the unit granted to another task) before the pool
    started the body must not be run on: the body checks a grant older than one heartbeat
    interval, finds it gone, and asks again instead (issue 17)."""
    scene.hold_the_task()
    scene.release_the_blocker()  # handed off to the held task
    scene.late.deliver(scene.gate)
    assert scene.pool_takes_work() == ["run"]
    # meanwhile the grant's lease ran out and another task got the unit
    assert scene.sem.release_token(scene.ticket)  # no claim: an operator's forced release
    intruder = scene.sem.try_acquire("intruder", claim="another", lease_ttl=60)
    assert intruder.permit is not None
    (req,) = scene.pool
    req.request_dict[GATE_HEADER]["granted_at"] = clock.monotonic() - 3600  # long ago
    ran = scene.run_the_body()
    assert not ran, "the body ran on a grant that had lapsed: 2 holders of a unit at limit 1"
    assert [h.token for h in scene.sem.holders()] == ["intruder"]
    # it waits again (parked) with its place in line, and runs once the unit is free
    assert [w.ticket for w in scene.sem.waiters()] == [scene.ticket]
    assert intruder.permit.release()


# -- while Redis fails: the gate thread's tick still runs, without Redis calls -----------------

#: the gate thread's pop on its wake list failed: logged once per outage
REDIS_FAILING = containing("gate: Redis is failing")
REDIS_BACK = containing("gate: Redis answers again after")


def test_while_redis_fails_a_task_held_too_long_stays_held_and_parks_once_redis_answers(
    redis_server: RedisServer,
    proxy: Proxy,
    gate_log: LogRecords,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with staged(redis_server, proxy.url(0)) as scene:
        scene.hold_the_task()
        monkeypatch.setattr(gate_timing, "PARK_ANYWAY", 1e9)
        proxy.set_mode("refuse")
        _hold_too_long(monkeypatch)
        assert gate_log.wait_count(REDIS_FAILING, 1, 20), "the gate never saw Redis fail"
        wait_until(lambda: scene.gate.outage.failures >= 3, 20, what="3 failed pops")
        assert gate_log.count(REDIS_FAILING) == 1  # once per outage, not once per failure
        assert scene.gate.held() == [scene.ticket]  # its place may take a handoff: it stays
        assert scene.consumer.soon == []
        proxy.set_mode("pass")
        assert scene.pool_takes_work() == ["park"]
        # the end of the outage is logged once, with how many calls failed
        assert gate_log.wait_count(REDIS_BACK, 1, 20), "the end of the outage was not logged"
        [back] = [r for r in gate_log.records if REDIS_BACK(r)]
        assert "failed call(s) meanwhile" in back.getMessage()


def test_while_redis_fails_a_task_held_far_too_long_parks_anyway(
    redis_server: RedisServer, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past PARK_ANYWAY times the longest hold it parks, so that the broker does not deliver
    the message again (its wrapper parks on the countdown alone)."""
    with staged(redis_server, proxy.url(0)) as scene:
        scene.hold_the_task()
        proxy.set_mode("refuse")
        _hold_too_long(monkeypatch)
        assert scene.pool_takes_work() == ["park"]
        proxy.set_mode("pass")


def test_while_redis_fails_a_held_task_past_max_wait_times_out(
    redis_server: RedisServer, proxy: Proxy, gate_log: LogRecords
) -> None:
    with staged(redis_server, proxy.url(0), max_wait=2.0) as scene:
        scene.hold_the_task()
        proxy.set_mode("refuse")
        assert scene.pool_takes_work() == ["timeout"]
        assert gate_log.count(REDIS_FAILING) == 1  # it timed out while Redis was refused
        proxy.set_mode("pass")


def test_a_held_task_whose_redis_always_fails_does_not_starve_the_others(
    redis_server: RedisServer, gate_log: LogRecords, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tick makes no more Redis calls once one failed; the next starts after the task whose
    call failed.  Task ``a`` (held first) fails every call (a fault injected into its
    semaphore: its Redis Cluster node is down, say); ``b``'s place, 3 s without a refresh,
    must still be refreshed, so it keeps its place in line."""
    with gate_app(redis_server, "gate-starve") as app:

        def task_on(name: str) -> Any:
            @app.task(name=f"gate_starve.{name}", shared=False, ignore_result=True)
            @limited(name, limit=1, lease_ttl=3)
            def job() -> None:
                pass

            return job

        gate = Gate(StoppedConsumer(app), lambda req: None, hold=10)
        sems = {n: semaphore_for(app, n, 1, 3.0) for n in ("a", "b")}
        reqs = {n: Request(task_on(n)) for n in ("a", "b")}
        gate.start()
        try:
            for name in ("a", "b"):
                blocker = sems[name].try_acquire("blocker", lease_ttl=600)
                assert blocker.permit is not None
                state.task_reserved(reqs[name])
                assert gate.on_task_request(reqs[name]) is None
                wait_until(lambda n=name: sems[n].waiters(), 10, what=f"{name} waits")
            (b_place,) = sems["b"].waiters()

            def unreachable(*args: Any, **kwargs: Any) -> Any:
                raise SemaphoreBackendError("injected: this node is down", name="a")

            monkeypatch.setattr(sems["a"], "try_acquire", unreachable)
            failing = containing("injected: this node is down")
            assert gate_log.wait_count(failing, 5, 30), "a's refreshes never failed"
            # over 4 s without b's refresh, its 3 s place would have expired: b would stand
            # at the back of the line again, with a new waiting_since
            assert [(w.ticket, w.waiting_since) for w in sems["b"].waiters()] == [
                (b_place.ticket, b_place.waiting_since)
            ]
        finally:
            gate.stop()
            for name in ("a", "b"):
                state.task_ready(reqs[name])
                heartbeat.unwatch(sems[name])
