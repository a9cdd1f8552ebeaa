"""The limit holds on every pool and on both brokers.

One cluster per broker (Redis, RabbitMQ), shared by the tests of this module: a prefork node,
a threads node and two solo nodes.  Each pool has its own queue, and every node also consumes
the shared queue (``env.queue``), so a test can aim at one pool or at all of them at once.
Concurrency is counted by the independent counter in the task bodies (proj.Body).

Limits: semaphore "main" is ``env.limit`` (3), semaphore "one" is 1 (proj.work_one).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix

from . import proj
from .conftest import RABBIT_URL, delete_rabbit_queue, require_rabbit
from .helpers import holders, inside, max_inside, ran, reset_bookkeeping
from .workers import Env, Worker, start_worker, start_workers, stop_workers, wait_until

pytestmark = pytest.mark.timeout(120)

LIMIT = 3


@dataclass
class Cluster:
    env: Env
    nodes: list[Worker]

    def queue(self, pool: str) -> str:
        return f"{self.env.queue}-{pool}"


def _queues(env: Env) -> list[str]:
    return [env.queue, *(f"{env.queue}-{p}" for p in ("prefork", "threads", "solo"))]


@pytest.fixture(scope="module", params=["redis", "rabbitmq"])
def cluster(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[Cluster]:
    if request.param == "rabbitmq":
        require_rabbit()
        broker = RABBIT_URL
    else:
        broker = redis_server.url(0)
    env = Env(redis_url=redis_server.url(0), broker_url=broker, limit=LIMIT)
    shared = [env.queue]
    nodes = start_workers(
        env,
        {"pool": "prefork", "concurrency": 3, "queues": [f"{env.queue}-prefork", *shared]},
        {"pool": "threads", "concurrency": 6, "queues": [f"{env.queue}-threads", *shared]},
        {"pool": "solo", "concurrency": 1, "queues": [f"{env.queue}-solo", *shared]},
        {"pool": "solo", "concurrency": 1, "queues": [f"{env.queue}-solo", *shared]},
    )
    try:
        yield Cluster(env, nodes)
    finally:
        stop_workers(nodes)
        client = redis_server.client(0)
        delete_prefix(client, env.prefix)
        if request.param == "redis":
            client.delete(*_queues(env))
        else:
            delete_rabbit_queue(env, *_queues(env))
        client.close()


@pytest.fixture
def env(cluster: Cluster) -> Iterator[Env]:
    env = cluster.env
    yield env
    # every test leaves nothing held, and the next starts from clean bookkeeping
    wait_until(lambda: not holders(env) and not holders(env, "one"), 10, what="no holders")
    reset_bookkeeping(env)


def _check_run(env: Env, tags: list[str], name: str = "main", limit: int = LIMIT) -> None:
    assert max_inside(env, name) == limit  # never more than the limit, and the limit was used
    assert inside(env, name) == 0
    assert sorted(ran(env)) == sorted(tags)  # every task ran exactly once
    assert holders(env, name) == []


def _pools(hosts: list[str]) -> set[str]:
    """Node names are ``<pool>-<hex>@localhost``."""
    return {h.split("-")[0] for h in hosts}


def test_prefork_pool(env: Env, cluster: Cluster) -> None:
    app = env.client_app()
    tags = [f"p{i}" for i in range(12)]
    results = [
        app.send_task(proj.work_where.name, (t, 0.2), queue=cluster.queue("prefork")) for t in tags
    ]
    hosts = [r.get(timeout=60) for r in results]
    # prefork -c 3 and limit 3: use semaphore "one" below to prove the cap really bites
    assert _pools(hosts) == {"prefork"}
    _check_run(env, tags)
    reset_bookkeeping(env)
    ones = [f"o{i}" for i in range(6)]
    results = [
        app.send_task(proj.work_one.name, (t, 0.2), queue=cluster.queue("prefork")) for t in ones
    ]
    assert _pools([r.get(timeout=60) for r in results]) == {"prefork"}
    _check_run(env, ones, "one", 1)


def test_threads_pool(env: Env, cluster: Cluster) -> None:
    """threads -c 6 against a limit of 3: half the slots must wait."""
    app = env.client_app()
    tags = [f"t{i}" for i in range(18)]
    results = [
        app.send_task(proj.work_where.name, (t, 0.2), queue=cluster.queue("threads")) for t in tags
    ]
    assert _pools([r.get(timeout=60) for r in results]) == {"threads"}
    _check_run(env, tags)


def test_two_solo_nodes(env: Env, cluster: Cluster) -> None:
    """Two solo nodes run two bodies at once unless the limit-1 semaphore stops them."""
    app = env.client_app()
    tags = [f"s{i}" for i in range(8)]
    results = [
        app.send_task(proj.work_one.name, (t, 0.2), queue=cluster.queue("solo")) for t in tags
    ]
    hosts = [r.get(timeout=60) for r in results]
    assert _pools(hosts) == {"solo"}
    assert len(set(hosts)) == 2, f"both solo nodes should have run tasks: {hosts}"
    _check_run(env, tags, "one", 1)


def test_mixed_pools_share_one_limit(env: Env, cluster: Cluster) -> None:
    """prefork, threads and two solo nodes on one queue, both semaphores at once."""
    app = env.client_app()
    mains = [f"m{i}" for i in range(24)]
    ones = [f"o{i}" for i in range(8)]
    results = []
    for i, t in enumerate(mains):
        results.append(app.send_task(proj.work_where.name, (t, 0.2)))
        if i % 3 == 0:
            results.append(app.send_task(proj.work_one.name, (ones[i // 3], 0.1)))
    hosts = [r.get(timeout=90) for r in results]
    assert len(_pools(hosts)) >= 2, f"expected several pools to take part: {sorted(set(hosts))}"
    assert max_inside(env) == LIMIT
    assert max_inside(env, "one") == 1
    assert inside(env) == inside(env, "one") == 0
    assert sorted(ran(env)) == sorted(mains + ones)
    assert holders(env) == []
    assert holders(env, "one") == []


def test_gevent_pool(redis_server: RedisServer) -> None:
    pytest.importorskip("gevent")
    env = Env(redis_url=redis_server.url(0), broker_url=redis_server.url(0), limit=LIMIT)
    node = start_worker(env, pool="gevent", concurrency=10)
    try:
        app = env.client_app()
        tags = [f"g{i}" for i in range(15)]
        results = [app.send_task(proj.work.name, (t, 0.2)) for t in tags]
        assert sorted(r.get(timeout=60) for r in results) == sorted(tags)
        _check_run(env, tags)
    finally:
        node.stop()
        client = redis_server.client(0)
        delete_prefix(client, env.prefix)
        client.delete(env.queue)
        client.close()
