"""The heartbeat keeps a permit alive far past its lease, in real workers.

Leases are 1 s here (``Env(lease=1.0)``; the heartbeat refreshes every lease/3), and the tasks
run 3 to 10 times longer.  Without working refreshes the lease would expire, be reclaimed, and
the next task would start while the first still runs: the independent counter in the bodies
(proj.Body) and the start/finish ledgers would show it, and the worker would log
"permit LOST".
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix

from . import proj
from .helpers import (
    HolderSampler,
    finished_at,
    holders,
    inside,
    max_inside,
    ran,
    started_at,
)
from .workers import Env, Worker, start_worker, stop_workers, wait_ready, wait_until

pytestmark = pytest.mark.timeout(120)

LEASE = 1.0


@pytest.fixture(scope="module")
def nodes(redis_server: RedisServer) -> Iterator[dict[str, tuple[Env, Worker]]]:
    """Two independent setups, started at the same time: limit 1 on a prefork node, and
    limit 4 on a threads node with 8 slots."""
    url = redis_server.url(0)
    one = Env(redis_url=url, broker_url=url, limit=1, lease=LEASE)
    four = Env(redis_url=url, broker_url=url, limit=4, lease=LEASE)
    started = {
        "one": (one, start_worker(one, pool="prefork", concurrency=2, wait=False)),
        "four": (four, start_worker(four, pool="threads", concurrency=8, wait=False)),
    }
    try:
        for env, worker in started.values():
            wait_ready(env, worker, 45)
        yield started
    finally:
        stop_workers([worker for _, worker in started.values()])
        client = redis_server.client(0)
        for env, _ in started.values():
            delete_prefix(client, env.prefix)
            client.delete(env.queue)
        client.close()


def test_long_task_keeps_its_permit_for_ten_leases(
    nodes: dict[str, tuple[Env, Worker]],
) -> None:
    env, worker = nodes["one"]
    app = env.client_app()
    with HolderSampler(env) as sampler:
        long = app.send_task(proj.work.name, ("long", 10 * LEASE))
        wait_until(lambda: "long" in started_at(env), 20, what="the long task started")
        # limit 1: this one must wait for the long task, although the lease is only 1 s
        short = app.send_task(proj.work.name, ("short", 0.1))
        assert long.get(timeout=40) == "long"
        assert short.get(timeout=40) == "short"
    assert not sampler.errors

    starts, ends = started_at(env), finished_at(env)
    assert ends["long"] - starts["long"] >= 10 * LEASE
    assert starts["short"] >= ends["long"], "the second task started while the first ran"
    assert max_inside(env) == 1
    assert sorted(ran(env)) == ["long", "short"]

    # every sample taken while the long body ran shows its permit, with a live lease
    during = [hs for t, hs in sampler.of_task(long.id) if starts["long"] < t < ends["long"]]
    assert len(during) > 100, "too few samples to judge"
    gaps = [hs for hs in during if len(hs) != 1 or hs[0].lease_remaining <= 0]
    assert not gaps, f"{len(gaps)} of {len(during)} samples without a live lease: {gaps[:3]}"
    assert max(hs[0].lease_remaining for hs in during) <= LEASE + 0.05
    assert all(len(hs) <= 1 for _, hs in sampler.samples)  # limit 1, never two holders

    assert "permit LOST" not in worker.log()
    assert holders(env) == []


def test_many_long_tasks_on_threads_never_lose_a_lease(
    nodes: dict[str, tuple[Env, Worker]],
) -> None:
    """threads -c 8, limit 4: eight 3 s tasks (3 leases each) in one process, one heartbeat."""
    env, worker = nodes["four"]
    app = env.client_app()
    tags = [f"h{i}" for i in range(8)]
    with HolderSampler(env) as sampler:
        results = [app.send_task(proj.work.name, (t, 3 * LEASE)) for t in tags]
        assert sorted(r.get(timeout=60) for r in results) == sorted(tags)
    assert not sampler.errors
    assert max_inside(env) == 4
    assert inside(env) == 0
    assert sorted(ran(env)) == sorted(tags)
    assert max(len(hs) for _, hs in sampler.samples) == 4
    assert all(h.lease_remaining > 0 for _, hs in sampler.samples for h in hs)
    starts, ends = started_at(env), finished_at(env)
    assert all(ends[t] - starts[t] >= 3 * LEASE for t in tags)
    assert "permit LOST" not in worker.log()
    assert holders(env) == []
