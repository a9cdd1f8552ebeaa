"""Fair sharing between queues, on real workers: a flooded queue does not starve another.

Queue A is flooded with short tasks while queue B sends a steady stream whose demand is above
its fair share; limit 4, two worker nodes consuming both queues.  While both queues have
waiters, B must hold at least (nearly) its max-min share of the units (2 of 4) and Jain's index
over the two partitions' usage must be >= 0.95.  The same load on a task with
``partition=None`` (one FIFO line) starves B: it holds almost nothing while A's flood drains.
The shares with fairness on are read from the semaphore's partitions while the load runs (the
allocation itself, unblurred by the grant-to-body delay that grows with CPU load); everything
else from the bodies' own ledgers (see :mod:`.fairness_stats`).  The limit and caps are
checked with an independent counter, and FIFO order within a partition with limit 1, where
the fencing tokens give the grant order exactly (with several units, grants reserved in line
order may be claimed, and get their tokens, in another order by the threads that release
them).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix

from . import proj
from .fairness_stats import PartitionSampler, Sample, collect, inversions, jain
from .helpers import holders, ledger, max_inside, reset_bookkeeping, semaphore
from .workers import Env, start_workers, stop_workers, wait_until

pytestmark = pytest.mark.timeout(120)

LIMIT = 4
FLOOD = 500  # A's tasks, 20 ms each
B_RATE = 15.0  # B's tasks per second, 200 ms each: 3 units of demand, above its share of 2
B_SECONDS = 3.0


@pytest.fixture
def two_queues(redis_server: RedisServer) -> Iterator[tuple[Env, str, str]]:
    env = Env(redis_url=redis_server.url(0), broker_url=redis_server.url(0), limit=LIMIT)
    yield env, f"{env.prefix}-a", f"{env.prefix}-b"
    client = redis_server.client(0)
    delete_prefix(client, env.prefix)
    client.close()


def _flood_and_trickle(env: Env, task: Any, qa: str, qb: str) -> dict[str, tuple[str, float]]:
    """Send A's flood, then B's steady stream; wait until every body has finished."""
    reset_bookkeeping(env)
    env.redis().delete(f"{env.prefix}:grants")
    app = env.client_app()
    sent: dict[str, tuple[str, float]] = {}
    try:
        for i in range(FLOOD):
            tag = f"A{i:04d}"
            sent[tag] = (qa, time.time())
            app.send_task(task.name, (tag, 0.02), queue=qa)
        began = time.monotonic()
        for i in range(int(B_RATE * B_SECONDS)):
            time.sleep(max(0.0, began + i / B_RATE - time.monotonic()))
            tag = f"B{i:04d}"
            sent[tag] = (qb, time.time())
            app.send_task(task.name, (tag, 0.2), queue=qb)
    finally:
        app.close()
    wait_until(
        lambda: len(ledger(env, "finished")) >= 2 * len(sent), 60, 0.2, what="every body finished"
    )
    return sent


def _served_during_flood(samples: list[Sample], qa: str, qb: str) -> float:
    """The fraction of B's tasks granted before A's last grant."""
    last_a = max(s.fencing for s in samples if s.partition == qa)
    b = [s for s in samples if s.partition == qb]
    return sum(1 for s in b if s.fencing < last_a) / len(b)


def test_a_flooded_queue_does_not_starve_another(two_queues: tuple[Env, str, str]) -> None:
    env, qa, qb = two_queues
    spec = {"pool": "threads", "concurrency": 6, "queues": [qa, qb]}
    nodes = start_workers(env, spec, spec)
    try:
        with PartitionSampler(semaphore(env, "fair", LIMIT)) as sampler:
            fair = collect(env, _flood_and_trickle(env, proj.fair_work, qa, qb))
        fair_max = max_inside(env, "fair")
        fifo = collect(env, _flood_and_trickle(env, proj.fifo_work, qa, qb))
        fifo_max = max_inside(env, "fifo")
    finally:
        stop_workers(nodes)
    assert fair_max == LIMIT  # the limit held (independent counter), and was used
    assert fifo_max == LIMIT

    assert sampler.errors == []
    use, samples = sampler.used_while_all_wait([qa, qb])
    assert samples >= 50, "A and B should both have had waiters for a while"
    # B's max-min share is 2 of the 4 units (its demand is 3); allow the hand-over gaps
    assert use[qb] >= 0.8 * LIMIT / 2, use
    assert jain([use[qa], use[qb]]) >= 0.95, use

    # B's tasks granted while A's flood was still being granted (by fencing token): nearly
    # all with fairness, nearly none in one line (partition=None), where B starves behind A
    assert _served_during_flood(fair, qa, qb) >= 0.75
    assert _served_during_flood(fifo, qa, qb) <= 0.25

    # FIFO within each partition, by grant (fencing) order
    for name in ("fair", "fifo"):
        wait_until(lambda n=name: not holders(env, n), 10, what=f"{name}: no holders")
        assert semaphore(env, name, LIMIT).waiters() == []


@pytest.mark.parametrize("hold", [pytest.param(1000, id="gate"), pytest.param(0, id="parking")])
def test_fifo_within_each_partition(two_queues: tuple[Env, str, str], hold: int) -> None:
    """Held by the gate, or without it (tasks park: re-published, woken by the release), each
    partition's tasks are granted in the order they joined its line (limit 1: one grant at a
    time, so the fencing tokens give the grant order exactly), and the two lines alternate."""
    env, qa, qb = two_queues
    env.limit = 1
    env.extra = {"semaphore_worker_hold": hold, "semaphore_slot_wait_timeout": 0.0}
    (node,) = start_workers(env, {"pool": "threads", "concurrency": 4, "queues": [qa, qb]})
    sem = semaphore(env, "fair", 1)
    app = env.client_app()
    sent: dict[str, tuple[str, float]] = {}
    try:
        held = sem.acquire(blocking=False)  # every task must wait
        assert held is not None
        for i in range(16):
            queue = qa if i % 2 == 0 else qb
            tag = f"{'A' if queue == qa else 'B'}{i:02d}"
            sent[tag] = (queue, time.time())
            app.send_task(proj.fair_work.name, (tag, 0.02), queue=queue)
            wait_until(lambda n=i + 1: len(sem.waiters()) == n, 20, what=f"{tag} in line")
        held.release()
        wait_until(
            lambda: len(ledger(env, "finished")) >= 2 * len(sent), 40, 0.1, what="all finished"
        )
    finally:
        app.close()
        stop_workers([node])
    assert ("parked in the broker for" in node.log()) == (hold == 0)
    samples = collect(env, sent)
    order = {tag: i for i, tag in enumerate(sent)}
    assert inversions(samples, order) == 0
    assert max_inside(env, "fair") == 1
    # the two lines alternate (max-min with one unit): A, B, A, B, ...
    granted = [s.partition for s in sorted(samples, key=lambda s: s.fencing)]
    assert granted == [qa, qb] * 8, granted
    wait_until(lambda: not holders(env, "fair") and not sem.waiters(), 10, what="nothing left")


def test_a_queue_cap_is_never_exceeded(two_queues: tuple[Env, str, str]) -> None:
    env, qa, qb = two_queues
    env.extra = {"semaphore_queue_limits": {"fair": {qa: 1}}}
    (node,) = start_workers(env, {"pool": "threads", "concurrency": 6, "queues": [qa, qb]})
    app = env.client_app()
    try:
        results = [app.send_task(proj.fair_work.name, (f"A{i}", 0.02), queue=qa) for i in range(60)]
        results += [
            app.send_task(proj.fair_work.name, (f"B{i}", 0.05), queue=qb) for i in range(30)
        ]
        for r in results:
            r.get(timeout=60)
    finally:
        app.close()
        stop_workers([node])
    assert max_inside(env, f"fair-{qa}") == 1  # the cap, counted by the bodies themselves
    assert max_inside(env, f"fair-{qb}") >= 3  # B takes what A may not
    assert max_inside(env, "fair") <= LIMIT
    wait_until(lambda: not holders(env, "fair"), 10, what="no holders")


def test_queue_weights_share_the_units_in_proportion(two_queues: tuple[Env, str, str]) -> None:
    """Both queues flooded; A weighs 3 (``semaphore_queue_weights``), B 1: while both wait, A
    holds about 3 of the 4 units and B 1."""
    env, qa, qb = two_queues
    env.extra = {"semaphore_queue_weights": {"fair": {qa: 3}}}
    (node,) = start_workers(env, {"pool": "threads", "concurrency": 8, "queues": [qa, qb]})
    app = env.client_app()
    sent = 0
    try:
        with PartitionSampler(semaphore(env, "fair", LIMIT)) as sampler:
            for i in range(120):
                for queue, name in ((qa, "A"), (qb, "B")):
                    app.send_task(proj.fair_work.name, (f"{name}{i:03d}", 0.05), queue=queue)
                    sent += 1
            wait_until(
                lambda: len(ledger(env, "finished")) >= 2 * sent, 60, 0.2, what="all finished"
            )
    finally:
        app.close()
        stop_workers([node])
    assert sampler.errors == []
    use, samples = sampler.used_while_all_wait([qa, qb])
    assert samples >= 30
    assert 2.2 <= use[qa] / use[qb] <= 4.5, use  # 3:1, give or take the hand-over gaps
    assert max_inside(env, "fair") <= LIMIT
