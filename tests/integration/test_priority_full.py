"""Priority and a bounded line on real workers: two prefork nodes (4 children each), with the
worker's gate and without it (tasks wait in their slot or park in the broker); and one prefork
node with 2 children, where which held task is ready for the one free slot decides the order.

The order bodies started in is read from their own ledger (:class:`tests.integration.proj.Body`),
the line's size from the semaphore, sampled while the burst runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from celery.exceptions import TaskRevokedError

from celery_semaphore import SemaphoreFull
from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix

from . import proj_prio
from .helpers import holders, inside, ran, reset_bookkeeping, semaphore, started
from .workers import Env, Worker, prefork_pair, wait_until, workers

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module", params=["gate", "no-gate"])
def nodes(
    request: pytest.FixtureRequest, redis_server: RedisServer
) -> Iterator[tuple[Env, list[Worker]]]:
    with prefork_pair(
        redis_server, "tests.integration.proj_prio", gate=request.param == "gate"
    ) as made:
        yield made


@pytest.fixture
def env(nodes: tuple[Env, list[Worker]]) -> Iterator[Env]:
    env, _ = nodes
    yield env
    reset_bookkeeping(env)


def _no_leak(env: Env, name: str) -> None:
    wait_until(lambda: not holders(env, name), 15, what=f"no holders of {name}")
    wait_until(lambda: semaphore(env, name).waiters() == [], 15, what=f"no waiters of {name}")


def _running(env: Env, name: str) -> None:
    wait_until(lambda: inside(env, name) >= 1, 20, what=f"a body of {name} runs")


def _overtake(env: Env) -> list[str]:
    """A blocker runs 4 s; 4 tasks of priority 0 wait in line, then one of priority 9: the
    order the bodies started in."""
    app = env.client_app()
    try:
        blocker = app.send_task(proj_prio.ordered.name, ("blocker", 0, 4.0))
        _running(env, "prio-order")
        lows = [app.send_task(proj_prio.ordered.name, (f"low{i}", 0)) for i in range(4)]
        sem = semaphore(env, "prio-order", 1)
        wait_until(lambda: len(sem.waiters()) == 4, 20, what="4 low tasks in line")
        high = app.send_task(proj_prio.ordered.name, ("high", 9))
        wait_until(lambda: len(sem.waiters()) == 5, 20, what="the high task in line")
        assert {w.priority for w in sem.waiters()} == {0, 9}
        for result in [blocker, *lows, high]:
            result.get(timeout=60)
    finally:
        app.close()
    return started(env)


def test_high_priority_overtakes_earlier_arrivals(env: Env) -> None:
    # Only the first two are checked: the low tasks' order among themselves is their arrival
    # at the semaphore, which is not the order they were sent in when two nodes hold them (a
    # node's first call to Redis may come later than the other's).
    order = _overtake(env)
    assert order[0] == "blocker"
    assert order[1] == "high", order
    _no_leak(env, "prio-order")


@pytest.fixture(scope="module")
def one_node(redis_server: RedisServer) -> Iterator[tuple[Env, Worker]]:
    """One prefork node with 2 children and the gate (no standby: it keeps a slot free)."""
    env = Env(
        redis_url=redis_server.url(0),
        broker_url=redis_server.url(0),
        extra={"include": ["tests.integration.proj_prio"]},
    )
    try:
        with workers(env, {"pool": "prefork", "concurrency": 2, "name": "one"}) as started_:
            yield env, started_[0]
    finally:
        client = redis_server.client(0)
        delete_prefix(client, env.prefix)
        client.delete(env.queue)


def test_high_priority_takes_the_one_free_slot_set_aside(one_node: tuple[Env, Worker]) -> None:
    """With the blocker in one slot, one held task is ready for the other: the first in line.
    The high task arrives last, when that slot is set aside for low0 already; it takes low0's
    place (low0 stops being ready).  Before, readiness went by arrival at the worker: the
    release granted low0, then each low task ahead of the high one (it ran last, every time)."""
    env, node = one_node
    try:
        order = _overtake(env)
        assert order == ["blocker", "high", "low0", "low1", "low2", "low3"], (
            order,
            node.log()[-4000:],
        )
        _no_leak(env, "prio-order")
    finally:
        reset_bookkeeping(env)


def test_max_waiting_is_never_exceeded_by_a_burst_from_two_nodes(env: Env) -> None:
    sem = semaphore(env, "bounded", 1)
    most = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            most[0] = max(most[0], len(sem.waiters()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    app = env.client_app()
    try:
        results = [app.send_task(proj_prio.bounded.name, (f"t{i}",)) for i in range(16)]
        states = []
        for result in results:
            try:
                result.get(timeout=60)
                states.append("SUCCESS")
            except TaskRevokedError:
                states.append(result.state)
    finally:
        stop.set()
        sampler.join(5)
        app.close()
    assert most[0] <= 3
    assert set(states) == {"SUCCESS", "REVOKED"}
    assert states.count("SUCCESS") == len(ran(env))
    assert 4 <= states.count("SUCCESS") < 16
    # refusals are counted per attempt: a task held by a gate is refused there, then again
    # in the slot the gate sends it to
    assert sem.inspect().full_total >= states.count("REVOKED")
    _no_leak(env, "bounded")


def test_fail_raises_semaphore_full_and_autoretry_catches_it(env: Env) -> None:
    app = env.client_app()
    try:
        first = app.send_task(proj_prio.failing.name, ("first", 1.5))
        _running(env, "failing")
        second = app.send_task(proj_prio.failing.name, ("second",))
        with pytest.raises(SemaphoreFull, match="line is full"):
            second.get(timeout=30)
        assert second.state == "FAILURE"
        first.get(timeout=30)
        blocker = app.send_task(proj_prio.retrying.name, ("blocker", 1.0))
        _running(env, "retrying")
        retried = app.send_task(proj_prio.retrying.name, ("retried",))
        assert retried.get(timeout=60) == "retried"
        blocker.get(timeout=30)
    finally:
        app.close()
    assert started(env)[-1] == "retried"
    _no_leak(env, "failing")
    _no_leak(env, "retrying")


def test_keep_newest_drops_the_waiting_task_for_the_newer_one(env: Env) -> None:
    app = env.client_app()
    sem = semaphore(env, "newest", 1)
    try:
        blocker = app.send_task(proj_prio.newest.name, ("blocker", 4.0))
        _running(env, "newest")
        old = app.send_task(proj_prio.newest.name, ("old",))
        wait_until(lambda: len(sem.waiters()) == 1, 20, what="the old task in line")
        new = app.send_task(proj_prio.newest.name, ("new",))
        assert new.get(timeout=60) == "new"
        with pytest.raises(TaskRevokedError):
            old.get(timeout=30)
        assert old.state == "REVOKED"
        blocker.get(timeout=30)
    finally:
        app.close()
    assert "old" not in started(env)
    assert sem.inspect().dropped_total == 1
    _no_leak(env, "newest")


def test_one_run_per_key_at_a_time_duplicates_dropped(env: Env) -> None:
    """The celery-once recipe: ``limit=1, max_waiting=0, on_full="drop"`` per user."""
    app = env.client_app()
    try:
        first = app.send_task(proj_prio.report.name, (1, 3.0))
        _running(env, "report-1")
        duplicates = [app.send_task(proj_prio.report.name, (1,)) for _ in range(5)]
        other = app.send_task(proj_prio.report.name, (2,))
        assert other.get(timeout=60) == "report-2"
        for dup in duplicates:
            with pytest.raises(TaskRevokedError):
                dup.get(timeout=30)
        assert first.get(timeout=30) == "report-1"
        # the key is free again: the next run is not a duplicate
        assert app.send_task(proj_prio.report.name, (1, 0.1)).get(timeout=30) == "report-1"
    finally:
        app.close()
    assert sorted(ran(env)) == ["report-1", "report-1", "report-2"]
    _no_leak(env, "report:1")
    _no_leak(env, "report:2")


def test_message_priority_orders_the_line(env: Env, nodes: tuple[Env, list[Worker]]) -> None:
    """``apply_async(priority=N)`` on the Redis transport: a lower N is served first."""
    app = env.client_app()
    sem = semaphore(env, "prio-message", 1)
    try:
        blocker = app.send_task(proj_prio.by_message.name, ("blocker", 4.0))
        _running(env, "prio-message")
        lows = [
            app.send_task(proj_prio.by_message.name, (f"low{i}",), priority=9) for i in range(3)
        ]
        wait_until(lambda: len(sem.waiters()) == 3, 20, what="3 low tasks in line")
        time.sleep(0.05)
        high = app.send_task(proj_prio.by_message.name, ("high",), priority=1)
        for result in [blocker, *lows, high]:
            result.get(timeout=60)
    finally:
        app.close()
    assert started(env)[:2] == ["blocker", "high"], started(env)
    _no_leak(env, "prio-message")
