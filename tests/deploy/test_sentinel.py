"""Sentinel (one master, one replica, one sentinel, started here from local binaries): the
``sentinel://`` settings reach the master, and during a failover under light load the client
follows the new master.  Operations that meet the failover fail with SemaphoreBackendError
(the documented exception) and nothing else; afterwards every operation works again."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from celery_semaphore import Semaphore, SemaphoreBackendError
from celery_semaphore.core.connection import check, describe_client, redis_client
from celery_semaphore.integration.config import redis_settings
from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix
from tests.integration import proj
from tests.integration.helpers import ran
from tests.integration.workers import Env, start_worker

from .servers import MASTER_NAME, SentinelSetup, redis_sentinel, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

PREFIX = "cssent"


@pytest.fixture
def sentinel() -> Iterator[SentinelSetup]:
    with redis_sentinel() as setup:
        yield setup


def _settings_client(setup: SentinelSetup) -> redis.Redis:
    app = Celery("sentinel", set_as_current=False)
    app.conf.update(
        semaphore_redis_url=setup.url,
        semaphore_redis_options={"master_name": MASTER_NAME},
    )
    s = redis_settings(app.conf)
    check(s.url, options=s.options)
    client: redis.Redis = redis_client(s.url, options=s.options)
    return client


def _role(port: int) -> str:
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, decode_responses=True)
    try:
        return str(client.info("replication")["role"])
    finally:
        client.close()


def test_sentinel_settings_reach_the_master(sentinel: SentinelSetup) -> None:
    client = _settings_client(sentinel)
    try:
        assert describe_client(client) == f"Sentinel master {MASTER_NAME!r}"
        sem = Semaphore("s", 2, redis=client, key_prefix=PREFIX)
        with sem.hold(timeout=5) as permit:
            assert permit.fencing_token == 1
            # written on the master, replicated to the replica
            direct = redis.Redis(host="127.0.0.1", port=sentinel.master_port)
            assert direct.hget(sem.keys.state, "fence") == b"1"
            direct.close()
        assert sem.inspect().used == 0
    finally:
        client.close()


@pytest.mark.parametrize("how", ["sentinel-failover", "kill-master"])
def test_client_follows_the_new_master_after_a_failover(sentinel: SentinelSetup, how: str) -> None:
    client = _settings_client(sentinel)
    sem = Semaphore("f", 2, redis=client, key_prefix=PREFIX, lease_ttl=5)
    stop = threading.Event()
    lock = threading.Lock()
    granted: list[float] = []
    failures: list[BaseException] = []
    other: list[BaseException] = []

    def load() -> None:
        while not stop.is_set():
            try:
                permit = sem.acquire(timeout=2)
                if permit is not None:
                    with lock:
                        granted.append(time.monotonic())
                    time.sleep(0.01)
                    permit.release()
            except SemaphoreBackendError as exc:
                with lock:
                    failures.append(exc)
                time.sleep(0.05)
            except BaseException as exc:  # anything else is a bug
                with lock:
                    other.append(exc)
                return
            time.sleep(0.01)

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(granted) >= 10, 10, "grants before the failover")
        if how == "sentinel-failover":
            admin = sentinel.sentinel()
            admin.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)  # type: ignore[no-untyped-call]
            admin.close()
        else:
            sentinel.group.kill(sentinel.master, signal.SIGKILL)
        wait_for(
            lambda: sentinel.master_port_now() == sentinel.replica_port,
            40,
            "the sentinel names the replica as master",
            interval=0.2,
        )
        wait_for(lambda: _role(sentinel.replica_port) == "master", 20, "the replica is promoted")
        switched = time.monotonic()
        wait_for(
            lambda: sum(1 for t in granted if t > switched) >= 10,
            30,
            "grants after the failover",
            interval=0.1,
        )
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=20)
    assert other == [], other
    # the grants after the switch were written on the new master
    new_master = redis.Redis(host="127.0.0.1", port=sentinel.replica_port)
    try:
        assert int(new_master.hget(sem.keys.state, "fence") or 0) >= 10
    finally:
        new_master.close()
    # whatever the failover lost or left behind is gone within a lease
    wait_for(lambda: sem.inspect().used == 0, 5 + 5, "no units held after the load")
    snap = sem.inspect()
    assert snap.holders == []
    assert snap.waiters == []
    client.close()


def test_a_celery_worker_carries_on_through_a_failover(
    sentinel: SentinelSetup, redis_server: RedisServer
) -> None:
    """Tasks that meet the failover fail closed (they park and come back); every task runs,
    once, and the worker's own clients follow the new master."""
    url = redis_server.url(0)
    env = Env(
        redis_url=url,
        broker_url=url,
        limit=2,
        # a task that ends while there is no master cannot release: its units come back when
        # its lease runs out (see docs/recipes.md#sentinel), so keep leases short here
        lease=5.0,
        extra={
            "semaphore_redis_url": sentinel.url,
            "semaphore_redis_options": {"master_name": MASTER_NAME},
            "semaphore_retry_backoff_max": 2.0,
        },
    )
    node = start_worker(env, concurrency=3, name="sentinel")
    app = env.client_app()
    try:
        results = [app.send_task(proj.work.name, (f"f{i}", 0.2)) for i in range(16)]
        wait_for(lambda: len(ran(env)) >= 4, 30, "tasks running before the failover")
        sentinel.group.kill(sentinel.master, signal.SIGKILL)
        wait_for(
            lambda: sentinel.master_port_now() == sentinel.replica_port,
            40,
            "the sentinel names the replica as master",
            interval=0.2,
        )
        assert sorted(r.get(timeout=90) for r in results) == sorted(f"f{i}" for i in range(16))
        assert sorted(ran(env)) == sorted(f"f{i}" for i in range(16))  # each ran once
        client = _settings_client(sentinel)
        sem = Semaphore("main", env.limit, redis=client, key_prefix=env.prefix)
        wait_for(lambda: sem.inspect().used == 0, 10, "no units held afterwards")
        # grants after the failover were made on the new master
        assert int(client.hget(sem.keys.state, "fence") or 0) >= 1
        client.close()
    finally:
        app.close()
        node.stop()
        local = redis_server.client(0)
        delete_prefix(local, env.prefix)
        local.delete(env.queue)
        local.close()
