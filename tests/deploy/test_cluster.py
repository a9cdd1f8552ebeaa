"""Against a real 3-master Redis Cluster (started here from local binaries): every Semaphore
operation, semaphores spread over several nodes, and a Celery worker round trip whose
semaphores live in the cluster (broker, results and bookkeeping stay on the session's Redis).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from celery_semaphore import AttemptStatus, Semaphore
from celery_semaphore.connection import describe_client, redis_client
from celery_semaphore.testing import RedisServer
from tests.conftest import delete_prefix
from tests.integration import proj
from tests.integration.helpers import inside, max_inside, ran
from tests.integration.workers import Env, start_worker, wait_until

from .servers import Cluster, redis_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with redis_cluster(masters=3) as c:
        yield c


@pytest.fixture
def client(cluster: Cluster) -> Iterator[Any]:
    c = redis_client(cluster.urls, cluster=True)
    try:
        yield c
    finally:
        c.close()


def delete_cluster_prefix(cluster: Cluster, prefix: str) -> None:
    """Delete every key under ``prefix`` on every node, one by one (a multi-key DEL across
    slots is refused by a cluster node)."""
    for port in cluster.ports:
        node = redis.Redis(host="127.0.0.1", port=port)
        try:
            for key in list(node.scan_iter(match=f"{prefix}:*", count=1000)):
                node.delete(key)
        finally:
            node.close()


@pytest.fixture
def prefix(cluster: Cluster) -> Iterator[str]:
    p = f"cscl-{uuid.uuid4().hex[:8]}"
    yield p
    delete_cluster_prefix(cluster, p)


def _nodes_with_keys(cluster: Cluster, prefix: str) -> set[int]:
    found = set()
    for port in cluster.ports:
        node = redis.Redis(host="127.0.0.1", port=port)
        try:
            if any(True for _ in node.scan_iter(match=f"{prefix}:*", count=1000)):
                found.add(port)
        finally:
            node.close()
    return found


def test_client_is_a_cluster_client(client: Any, cluster: Cluster) -> None:
    assert isinstance(client, RedisCluster)
    assert len(client.get_primaries()) == 3  # type: ignore[no-untyped-call]
    assert describe_client(client).startswith("Redis Cluster via 127.0.0.1:")


def test_every_operation_works_on_semaphores_spread_over_the_nodes(
    client: Any, cluster: Cluster, prefix: str
) -> None:
    names = [f"sem-{i}" for i in range(12)]  # 12 hash tags: keys land on every master
    for name in names:
        sem = Semaphore(name, 2, redis=client, key_prefix=prefix, lease_ttl=5)
        a = sem.acquire(blocking=False)
        b = sem.acquire(blocking=False, weight=1)
        assert a is not None
        assert b is not None
        assert b.fencing_token > a.fencing_token
        assert sem.acquire(blocking=False) is None  # full
        # a waiter with its own ticket keeps a place; withdraw gives it up
        ticket = Semaphore.new_ticket()
        waiting = sem.try_acquire(ticket, place_ttl=5)
        assert waiting.status is AttemptStatus.WAITING
        assert waiting.position == 0
        snap = sem.inspect()
        assert snap.used == 2
        assert len(snap.holders) == 2
        assert len(snap.waiters) == 1
        assert sem.withdraw(ticket) is True
        assert a.refresh(lease_ttl=10) is True
        assert a.lease_expires_at > snap.server_time + 5
        assert a.release() is True
        assert b.release() is True
        assert sem.inspect().used == 0
        # limit override, stored in Redis, obeyed by another object of the same semaphore
        sem.set_limit_override(1)
        other = Semaphore(name, 5, redis=client, key_prefix=prefix)
        held = other.acquire(blocking=False)
        assert held is not None
        assert other.acquire(blocking=False) is None
        assert other.inspect().limit == 1
        held.release()
        sem.set_limit_override(None)
        assert sem.inspect().limit_override is None
        assert sem.reclaim() == 0
    assert len(_nodes_with_keys(cluster, prefix)) == 3, "the names should cover all 3 masters"


def test_expired_lease_is_reclaimed(client: Any, prefix: str) -> None:
    sem = Semaphore("lease", 1, redis=client, key_prefix=prefix, lease_ttl=0.3)
    permit = sem.acquire(blocking=False)
    assert permit is not None
    wait_until(lambda: sem.reclaim() == 1 or sem.inspect().used == 0, 5, what="lease reclaimed")
    assert sem.inspect().used == 0
    assert permit.refresh() is False
    assert permit.lost


def test_a_blocked_waiter_is_woken_by_the_release(client: Any, prefix: str) -> None:
    # poll_interval 1.8 s (below the 2 s socket timeout): a wake-up well under it came from
    # the release's push, not from polling
    sem = Semaphore("wake", 1, redis=client, key_prefix=prefix, poll_interval=1.8)
    holder = sem.acquire(blocking=False)
    assert holder is not None
    got: list[Any] = []
    entered = threading.Event()

    def wait() -> None:
        entered.set()
        got.append((sem.acquire(timeout=10), time.monotonic()))

    thread = threading.Thread(target=wait)
    thread.start()
    assert entered.wait(5)
    wait_until(lambda: len(sem.waiters()) == 1, 5, what="the waiter is in line")
    time.sleep(0.3)  # let it block on its wake list
    released_at = time.monotonic()
    holder.release()
    thread.join(timeout=10)
    permit, at = got[0]
    assert permit is not None
    assert at - released_at < 1.0
    permit.release()
    assert sem.inspect().used == 0
    assert sem.waiters() == []


def test_contention_never_exceeds_the_limit(client: Any, prefix: str) -> None:
    sem = Semaphore("busy", 2, redis=client, key_prefix=prefix)
    lock = threading.Lock()
    current, peak, done = [0], [0], [0]
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(5):
                with sem.hold(timeout=20):
                    with lock:
                        current[0] += 1
                        peak[0] = max(peak[0], current[0])
                    time.sleep(0.01)
                    with lock:
                        current[0] -= 1
                        done[0] += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert done[0] == 30
    assert peak[0] == 2
    assert sem.inspect().used == 0


def test_celery_worker_round_trip_against_the_cluster(
    cluster: Cluster, redis_server: RedisServer
) -> None:
    env = Env(
        redis_url=redis_server.url(0),
        broker_url=redis_server.url(0),
        limit=2,
        extra={"semaphore_redis_url": cluster.urls, "semaphore_redis_cluster": True},
    )
    node = start_worker(env, concurrency=3, name="cluster")
    client = redis_client(cluster.urls, cluster=True)
    try:
        app = env.client_app()
        results = [app.send_task(proj.work.name, (f"c{i}", 0.1)) for i in range(10)]
        assert [r.get(timeout=60) for r in results] == [f"c{i}" for i in range(10)]
        assert max_inside(env) == env.limit
        assert inside(env) == 0
        assert sorted(ran(env)) == sorted(f"c{i}" for i in range(10))
        sem = Semaphore("main", env.limit, redis=client, key_prefix=env.prefix)
        wait_until(lambda: sem.inspect().holders == [], 10, what="no holders left")
        snap = sem.inspect()
        # the grants really happened in the cluster: ten fencing tokens were handed out there
        fence = client.hget(sem.keys.state, "fence")
        assert snap.used == 0
        assert int(fence) >= 10
        app.close()
        # nothing went wrong on the way (e.g. the registry's WATCH/MULTI, the gate's BLPOP)
        problems = [
            line
            for line in node.log().splitlines()
            if ("WARNING/" in line or "ERROR/" in line or "CRITICAL/" in line)
        ]
        assert problems == []
    finally:
        node.stop()
        client.close()
        delete_cluster_prefix(cluster, env.prefix)
        local = redis_server.client(0)
        delete_prefix(local, env.prefix)
        local.delete(env.queue)
        local.close()
