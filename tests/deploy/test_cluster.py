"""Against a real 3-master Redis Cluster (started here from local binaries): every Semaphore
operation, semaphores spread over several nodes, and a Celery worker round trip whose
semaphores live in the cluster (broker, results and bookkeeping stay on the session's Redis).
"""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from celery_semaphore import AttemptStatus, GroupPermit, Semaphore, SemaphoreGroup
from celery_semaphore.core.connection import describe_client, redis_client
from celery_semaphore.ops.testing import RedisServer
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


def test_rates_work_on_semaphores_spread_over_the_nodes(
    client: Any, cluster: Cluster, prefix: str
) -> None:
    # the starts key (KEYS[4]) shares the semaphore's slot: every script runs on every master
    names = [f"rated-{i}" for i in range(12)]
    for name in names:
        sem = Semaphore(name, 5, redis=client, key_prefix=prefix, rate=["2/h", "3/d"])
        first = sem.acquire(blocking=False)
        second = sem.acquire(blocking=False)
        assert first is not None
        assert second is not None
        assert sem.acquire(blocking=False) is None  # units free, the hour's window full
        waiting = sem.try_acquire("w", place_ttl=5)
        assert waiting.status is AttemptStatus.WAITING
        assert waiting.rate_retry_after is not None
        assert 3500 < waiting.rate_retry_after <= 3600
        assert first.release() is True
        assert second.release() is True
        assert [(w.rate.count, w.started) for w in sem.inspect().rates] == [(2, 2), (3, 2)]
        assert sem.withdraw("w") is True
    assert len(_nodes_with_keys(cluster, prefix)) == 3, "the names should cover all 3 masters"


def test_expired_lease_is_reclaimed(client: Any, prefix: str) -> None:
    sem = Semaphore("lease", 1, redis=client, key_prefix=prefix, lease_ttl=0.3)
    permit = sem.acquire(blocking=False)
    assert permit is not None
    wait_until(lambda: sem.reclaim() == 1 or sem.inspect().used == 0, 5, what="lease reclaimed")
    assert sem.inspect().used == 0
    assert permit.refresh() is False
    assert permit.lost


def test_liveness_is_off_on_the_cluster_and_the_lease_alone_counts(
    client: Any, prefix: str
) -> None:
    """The liveness records' one key cannot share a script with a semaphore's keys on a
    cluster: a Semaphore given liveness_ttl works as without it (no record, leases only)."""
    sem = Semaphore("live", 1, redis=client, key_prefix=prefix, lease_ttl=0.1, liveness_ttl=3.0)
    permit = sem.acquire(blocking=False)
    assert permit is not None
    assert sem._live_arg == ""
    assert client.exists(f"{prefix}:procs") == 0
    time.sleep(0.3)
    assert sem.acquire(blocking=False) is not None  # the lease, as ever


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
        extra={
            "semaphore_redis_url": cluster.urls,
            "semaphore_redis_cluster": True,
            # proj also has tasks that take two semaphores at once: one slot for all
            "semaphore_hash_tag": "proj",
        },
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
        sem = Semaphore("main", env.limit, redis=client, key_prefix=env.prefix, hash_tag="proj")
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


# -- several semaphores at once: one hash_tag per group ---------------------------------------


def _slot(client: Any, key: str) -> int:
    return int(client.keyslot(key))


def test_groups_sharing_a_hash_tag_work_on_every_master(
    client: Any, cluster: Cluster, prefix: str
) -> None:
    tags = [f"team-{i}" for i in range(8)]  # 8 hash tags: groups land on every master
    for tag in tags:
        gpu = Semaphore("gpu", 2, redis=client, key_prefix=prefix, hash_tag=tag)
        licence = Semaphore("licence", 1, redis=client, key_prefix=prefix, hash_tag=tag)
        slots = {_slot(client, k) for s in (gpu, licence) for k in s.keys.state_keys()}
        assert len(slots) == 1  # one script, one slot
        group = SemaphoreGroup([(gpu, 1), (licence, 1)])
        permit = group.acquire(blocking=False)
        assert permit is not None
        assert gpu.inspect().used == 1
        assert licence.inspect().used == 1
        # licence is full: the next group gets nothing at all (all or nothing)
        assert group.acquire(blocking=False) is None
        assert gpu.inspect().used == 1
        assert permit.refresh() is True
        # a blocked group waiter is woken by the release that frees its units
        got: list[Any] = []
        thread = threading.Thread(target=lambda g=group, out=got: out.append(g.acquire(timeout=10)))
        thread.start()
        wait_until(lambda s=licence: len(s.waiters()) == 1, 5, what="the group waits")
        assert len(gpu.waiters()) == 1  # a place in every member's line
        assert permit.release() is True
        thread.join(timeout=10)
        assert isinstance(got[0], GroupPermit)
        got[0].release()
        assert gpu.inspect().used == 0
        assert licence.inspect().used == 0
        # a ticket that gives up its place leaves no trace in any line
        ticket = Semaphore.new_ticket()
        holder = licence.acquire(blocking=False)
        assert holder is not None
        assert group.try_acquire(ticket, place_ttl=5).status is AttemptStatus.WAITING
        assert group.withdraw(ticket) is True
        assert gpu.waiters() == []
        holder.release()
    assert len(_nodes_with_keys(cluster, prefix)) == 3, "the tags should cover all 3 masters"


def test_a_group_without_a_common_hash_tag_is_refused_on_the_cluster(
    client: Any, prefix: str
) -> None:
    a = Semaphore("a", 1, redis=client, key_prefix=prefix)
    b = Semaphore("b", 1, redis=client, key_prefix=prefix)
    with pytest.raises(ValueError, match="hash_tag"):
        SemaphoreGroup([(a, 1), (b, 1)]).acquire(blocking=False)


def test_the_cli_finds_and_operates_semaphores_on_every_master(
    client: Any, cluster: Cluster, prefix: str, redis_url: str
) -> None:
    import json

    from tests.ops.conftest import make_app, run_cli

    app = make_app(redis_url, prefix)  # broker and results on the session's Redis
    app.conf.update(semaphore_redis_url=cluster.urls, semaphore_redis_cluster=True)
    # Celery gives every app of this process the shared tasks of modules imported so far
    # (any test module's): a two-semaphore task among them would (rightly) fail the CLI's
    # start check on a cluster without semaphore_hash_tag.  This app has no tasks of its own.
    app.finalize()
    for name in [n for n in app.tasks if not n.startswith("celery.")]:
        app.tasks.pop(name)
    names = [f"loose-{i}" for i in range(9)]  # used without Celery: only SCAN finds them
    for name in names:
        held = Semaphore(name, 2, redis=client, key_prefix=prefix).acquire(blocking=False)
        assert held is not None
    assert len(_nodes_with_keys(cluster, prefix)) == 3
    try:
        listed = run_cli(app, "list", "--json")
        assert listed.exit_code == 0, listed.output
        rows = {row["name"]: row for row in json.loads(listed.stdout)}
        assert set(names) <= set(rows)  # SCAN went over every master
        assert all(rows[name]["used"] == 1 for name in names)
        reset = run_cli(app, "reset", names[0], "--yes")
        assert reset.exit_code == 0, reset.output
        assert Semaphore(names[0], 2, redis=client, key_prefix=prefix).inspect().used == 0
    finally:
        app.close()


def test_several_semaphores_per_task_on_the_cluster_with_semaphore_hash_tag(
    cluster: Cluster, redis_server: RedisServer
) -> None:
    """A task limited by two semaphores at once (one group script) runs on a cluster when
    they share a slot through semaphore_hash_tag."""
    env = Env(
        redis_url=redis_server.url(0),
        broker_url=redis_server.url(0),
        limit=2,
        extra={
            "semaphore_redis_url": cluster.urls,
            "semaphore_redis_cluster": True,
            "semaphore_hash_tag": "proj",
        },
    )
    node = start_worker(env, concurrency=3, name="cluster-multi")
    client = redis_client(cluster.urls, cluster=True)
    try:
        app = env.client_app()
        ring = 3
        jobs = [(i % ring, (i + 1) % ring) for i in range(ring)] * 4
        results = [
            app.send_task(proj.pair.name, (a, b, f"p{n}", 0.05)) for n, (a, b) in enumerate(jobs)
        ]
        assert sorted(r.get(timeout=60) for r in results) == sorted(f"p{n}" for n in range(12))
        app.close()
        for resource in range(ring):
            assert max_inside(env, f"pair-{resource}") == 1, resource  # independent counter
        for resource in range(ring):
            sem = Semaphore(
                f"pair:{resource}", 1, redis=client, key_prefix=env.prefix, hash_tag="proj"
            )
            assert sem.inspect().holders == []
            assert int(client.hget(sem.keys.state, "fence") or 0) >= 1  # granted in the cluster
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


def test_a_worker_with_multi_semaphore_tasks_needs_semaphore_hash_tag_on_a_cluster(
    cluster: Cluster, redis_server: RedisServer
) -> None:
    env = Env(
        redis_url=redis_server.url(0),
        broker_url=redis_server.url(0),
        extra={"semaphore_redis_url": cluster.urls, "semaphore_redis_cluster": True},
    )
    node = start_worker(env, concurrency=1, wait=False)
    try:
        try:
            code = node.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker kept running:\n{node.log()[-2000:]}")
        text = node.output() + node.log()
        assert code != 0
        assert "takes several semaphores at once" in text, text[-2000:]
        assert "set semaphore_hash_tag" in text
    finally:
        node.stop(timeout=5)
