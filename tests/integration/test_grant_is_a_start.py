"""A grant is a start: the worker's gate takes a permit only for a task a free pool slot starts
at once.  Other work fills every slot of a node (four plain tasks of a few seconds on ``-c 4``)
while tasks limited by ``rate="2/s"`` arrive: none may be granted while no slot can start it,
so when the slots free, the rated bodies still start 2 per second, read from their own clocks.

(Before, the gate granted them at the rate while the pool was busy; the grants waited in the
pool and about 6 bodies started together once the plain tasks ended, in every run.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from celery_semaphore.ops.testing import RedisServer

from . import proj, proj_rates
from .helpers import holders, ledger, reset_bookkeeping, semaphore, started_at
from .test_rates import SLACK, _most_in_window
from .workers import Env, Worker, start_workers, stop_workers, wait_until

pytestmark = pytest.mark.timeout(120)

BUSY = 3.0  # seconds the plain tasks fill the slots


@pytest.fixture(scope="module", params=["prefork", "threads"])
def node(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[tuple[Env, Worker]]:
    env = Env(
        redis_url=redis_server.url(0),
        broker_url=redis_server.url(0),
        extra={"include": ["tests.integration.proj_rates"]},
    )
    (worker,) = start_workers(env, {"pool": request.param, "concurrency": 4})
    try:
        yield env, worker
    finally:
        stop_workers([worker])
        reset_bookkeeping(env)


def test_no_grant_while_other_work_fills_every_slot(node: tuple[Env, Worker]) -> None:
    env, _ = node
    app = env.client_app()
    try:
        plain = [app.send_task(proj.unlimited.name, (f"p{i}", BUSY)) for i in range(4)]
        wait_until(
            lambda: len(ledger(env, "unlimited_started")) == 4, 30, what="4 plain tasks running"
        )
        sent = time.time()
        rated = [app.send_task(proj_rates.rated_busy.name, (f"r{i}",)) for i in range(10)]
        # while the plain tasks run, nothing is granted, so nothing counts in the rate window
        wait_until(lambda: len(semaphore(env, "rated-busy").waiters()) == 10, 10, what="10 in line")
        assert holders(env, "rated-busy") == []
        for result in plain + rated:
            result.get(timeout=60)
    finally:
        app.close()
    starts = sorted(at for tag, at in started_at(env).items() if tag.startswith("r"))
    assert len(starts) == 10
    assert starts[0] - sent >= BUSY - 1.0, "a rated body ran while the slots were busy"
    assert _most_in_window(starts, 1.0 - SLACK) <= 2, [round(t - starts[0], 3) for t in starts]
    # 10 starts at 2 per second: the last at least 4 s after the first
    assert starts[-1] - starts[0] >= 4.0 - SLACK
    wait_until(lambda: not holders(env, "rated-busy"), 10, what="no holders")
    assert semaphore(env, "rated-busy").waiters() == []


def test_a_held_task_is_not_starved_by_a_steady_flow_of_other_work(
    node: tuple[Env, Worker],
) -> None:
    """Other tasks keep the pool's queue full for about 17 s (more in it than the pool has
    slots, refilled from the broker as they end): a held task never finds a free slot, so after
    a few seconds it takes its turn in the pool's queue, and runs long before the flow ends
    (without that, it would run only once the flow drains)."""
    env, _ = node
    flow, each = 160, 0.4  # 168 tasks of 0.4 s on 4 slots
    app = env.client_app()
    try:
        first = [app.send_task(proj.unlimited.name, (f"a{i}", each)) for i in range(8)]
        wait_until(
            lambda: len(ledger(env, "unlimited_started")) >= 4, 30, what="the slots are busy"
        )
        held = app.send_task(proj_rates.rated_busy.name, ("held",))
        rest = [app.send_task(proj.unlimited.name, (f"b{i}", each)) for i in range(flow)]
        held.get(timeout=60)
        for result in first + rest:
            result.get(timeout=90)
    finally:
        app.close()
    began = {
        line.rsplit(":", 1)[0]: float(line.rsplit(":", 1)[1])
        for line in ledger(env, "unlimited_started")
    }
    started = started_at(env)["held"]
    later = [tag for tag, at in began.items() if at > started]
    # it waited for a slot a few seconds, then took its turn: most of the flow came after it
    assert len(later) >= flow // 2, (len(later), sorted(began.values())[-1] - started)
