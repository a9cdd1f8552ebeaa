"""Priority with RabbitMQ as the broker (higher first, as in the limiter), on two prefork nodes
with the gate and without it, and the bound with a short ``semaphore_priority_step``: a
priority-0 task is never passed by a priority-9 one that arrived more than 9 steps after it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from celery_semaphore.ops.testing import RedisServer

from . import proj_prio
from .conftest import RABBIT_URL, delete_rabbit_queue, require_rabbit
from .helpers import holders, inside, reset_bookkeeping, semaphore, started
from .workers import Env, Worker, start_workers, stop_workers, wait_until

pytestmark = pytest.mark.timeout(180)

#: seconds one step of priority moves a task forward (9 steps: 2.7 s)
STEP = 0.3


@pytest.fixture(scope="module", params=["gate", "no-gate"])
def nodes(
    request: pytest.FixtureRequest, redis_server: RedisServer
) -> Iterator[tuple[Env, list[Worker]]]:
    require_rabbit()
    extra: dict[str, object] = {
        "include": ["tests.integration.proj_prio"],
        "semaphore_priority_step": STEP,
    }
    if request.param == "no-gate":
        extra["semaphore_worker_hold"] = 0
    env = Env(redis_url=redis_server.url(0), broker_url=RABBIT_URL, extra=extra)
    spec = {"pool": "prefork", "concurrency": 4}
    started_nodes = start_workers(env, {**spec, "name": "a"}, {**spec, "name": "b"})
    try:
        yield env, started_nodes
    finally:
        stop_workers(started_nodes)
        client = redis_server.client(0)
        from tests.conftest import delete_prefix

        delete_prefix(client, env.prefix)
        client.close()
        delete_rabbit_queue(env)


@pytest.fixture
def env(nodes: tuple[Env, list[Worker]]) -> Iterator[Env]:
    env, _ = nodes
    yield env
    reset_bookkeeping(env)


def _send_in_line(env: Env, name: str, task: object, calls: list[tuple[tuple[object, ...], int]]):  # type: ignore[no-untyped-def]
    """Send each (args, message priority) and wait until it stands in line; the results."""
    app = env.client_app()
    sem = semaphore(env, name, 1)
    results = []
    try:
        for i, (args, priority) in enumerate(calls):
            results.append(app.send_task(task.name, args, priority=priority))  # type: ignore[attr-defined]
            wait_until(lambda n=i + 1: len(sem.waiters()) == n, 20, what=f"{i + 1} in line")
    finally:
        app.close()
    return results


def test_message_priority_is_higher_first_on_rabbitmq(env: Env) -> None:
    app = env.client_app()
    try:
        blocker = app.send_task(proj_prio.by_message.name, ("blocker", 4.0))
        wait_until(lambda: inside(env, "prio-message") == 1, 20, what="the blocker runs")
    finally:
        app.close()
    lows = _send_in_line(
        env, "prio-message", proj_prio.by_message, [((f"low{i}",), 0) for i in range(3)]
    )
    app = env.client_app()
    try:
        high = app.send_task(proj_prio.by_message.name, ("high",), priority=9)
        for result in [blocker, *lows, high]:
            result.get(timeout=60)
    finally:
        app.close()
    assert started(env)[:2] == ["blocker", "high"], started(env)


def test_no_task_is_passed_by_one_that_came_more_than_nine_steps_later(env: Env) -> None:
    app = env.client_app()
    sem = semaphore(env, "prio-order", 1)
    try:
        blocker = app.send_task(proj_prio.ordered.name, ("blocker", 0, 9 * STEP + 6.0))
        wait_until(lambda: inside(env, "prio-order") == 1, 20, what="the blocker runs")
        old = app.send_task(proj_prio.ordered.name, ("old", 0))
        wait_until(lambda: len(sem.waiters()) == 1, 20, what="the old task in line")
        time.sleep(9 * STEP + 0.5)  # past the bound
        late = app.send_task(proj_prio.ordered.name, ("late", 9))
        wait_until(lambda: len(sem.waiters()) == 2, 20, what="the late task in line")
        soon = app.send_task(proj_prio.ordered.name, ("soon", 1))
        wait_until(lambda: len(sem.waiters()) == 3, 20, what="the third task in line")
        vip = app.send_task(proj_prio.ordered.name, ("vip", 9))
        wait_until(lambda: len(sem.waiters()) == 4, 20, what="the fourth task in line")
        for result in (blocker, old, late, soon, vip):
            result.get(timeout=60)
    finally:
        app.close()
    # "late" (priority 9) came more than 9 steps after "old": it does not pass it; "vip"
    # (priority 9) came within 9 steps of "soon" (priority 1): it passes it, not "late"
    assert started(env) == ["blocker", "old", "late", "vip", "soon"], started(env)
    wait_until(lambda: not holders(env, "prio-order"), 15, what="no holders")
