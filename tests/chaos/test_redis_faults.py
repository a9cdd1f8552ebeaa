"""Redis fails under load: unreachable for seconds, connections dropped mid-script, scripts
flushed (NOSCRIPT), and a clock jump on the worker host.

The semaphores live on a redis-server this module starts itself, reached through a TCP proxy
the tests control (:mod:`tests.chaos.proxy`); the broker and the result backend stay on the
session's Redis, so only the semaphore's Redis fails.  Two prefork nodes, limit 2, lease 6 s.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import TypeVar

import pytest

from celery_semaphore import AttemptStatus, Semaphore, SemaphoreBackendError
from celery_semaphore.ops.testing import RedisServer, start_redis_server
from tests.conftest import delete_prefix
from tests.integration.workers import Worker, start_workers, stop_workers, wait_until

from .harness import Chaos, measure
from .proxy import Proxy

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(150)]

LEASE = 6.0
_T = TypeVar("_T")


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    server = start_redis_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def proxy(own_redis: RedisServer) -> Iterator[Proxy]:
    p = Proxy(own_redis.port)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture(scope="module")
def cluster(redis_server: RedisServer, proxy: Proxy) -> Iterator[tuple[Chaos, list[Worker]]]:
    session = redis_server.url(0)
    chaos = Chaos(
        sem_url=proxy.url(0), broker_url=session, backend_url=session, limit=2, lease=LEASE
    )
    nodes = start_workers(
        chaos.env, {"concurrency": 2, "name": "a"}, {"concurrency": 2, "name": "b"}
    )
    try:
        yield chaos, nodes
    finally:
        stop_workers(nodes)
        chaos.close()
        client = redis_server.client(0)
        delete_prefix(client, chaos.env.prefix)
        client.delete(chaos.env.queue)
        client.close()


@pytest.fixture
def chaos(cluster: tuple[Chaos, list[Worker]], proxy: Proxy) -> Iterator[Chaos]:
    c, _ = cluster
    proxy.set_mode("pass")
    c.reset()
    yield c
    proxy.set_mode("pass")
    (c.dir / "clock-skew").unlink(missing_ok=True)
    wait_until(lambda: not c.semaphore().holders(), LEASE + 5, what="no holders between tests")


def _logs(nodes: list[Worker]) -> str:
    return "\n".join(n.log() for n in nodes)


def test_redis_unreachable_for_seconds(
    chaos: Chaos, proxy: Proxy, cluster: tuple[Chaos, list[Worker]]
) -> None:
    """8 s without Redis, with bodies running and tasks waiting: nothing runs without a
    permit, nothing is lost, and the work resumes by itself once Redis is back."""
    nodes = cluster[1]
    chaos.load(16, 0.4)
    wait_until(lambda: len(chaos.running()) == 2, 60, what="two bodies run")
    proxy.set_mode("refuse")
    down = time.monotonic()
    time.sleep(8.0)  # the outage itself: nothing to poll for
    starts_during = [e for e in chaos.rec.ledger() if e.event == "start" and e.at > time.time() - 7]
    proxy.set_mode("pass")
    back = time.monotonic()
    before = len([e for e in chaos.rec.ledger() if e.event == "start"])
    wait_until(
        lambda: len([e for e in chaos.rec.ledger() if e.event == "start"]) > before,
        LEASE + 30,
        what="a body starts after Redis is back",
    )
    measure(
        "Redis unreachable 8 s", "first body starts after Redis is back", time.monotonic() - back
    )
    report = chaos.assert_promise(nodes, results_within=120)
    measure(
        "Redis unreachable 8 s", "all 16 tasks done after Redis went down", time.monotonic() - down
    )
    assert report.states["SUCCESS"] == 16
    assert starts_during == [], "a body started while the semaphore's Redis was unreachable"
    logs = _logs(nodes)
    # the backend error names where Redis is: "semaphore 'main': Redis at redis://... failed"
    assert re.search(r"Redis at \S+ failed|unavailable", logs), "no log line says Redis failed"


def test_connections_dropped_mid_script(
    chaos: Chaos, proxy: Proxy, cluster: tuple[Chaos, list[Worker]]
) -> None:
    """A fifth of the replies from Redis never arrive (the connection drops after the server
    ran the command), for 6 s under load; redis-py sends each such call again."""
    chaos.load(24, 0.2)
    wait_until(lambda: len(chaos.running()) == 2, 60, what="two bodies run")
    proxy.set_mode("cut", p=0.2)
    time.sleep(6.0)  # the faulty period itself
    proxy.set_mode("pass")
    assert proxy.cuts > 0
    report = chaos.assert_promise(cluster[1], results_within=120)
    assert report.states["SUCCESS"] == 24


def _persist(call: Callable[[], _T]) -> _T:
    """Call again after a SemaphoreBackendError (redis-py gave up re-sending): the same
    call, same ticket and claim, as a client that does not know whether it was applied."""
    for _ in range(100):
        try:
            return call()
        except SemaphoreBackendError:
            continue
    raise AssertionError("Redis failed 100 times in a row")


def test_core_calls_resent_after_a_drop_are_idempotent(chaos: Chaos, proxy: Proxy) -> None:
    """The same, against the core directly: two threads acquire and release limit 1 through
    a proxy that withholds a fifth of the replies (handshakes included).  A re-sent acquire
    never grants twice (the same claim gets the same grant back), a re-sent release never
    frees twice (its tombstone answers), and the state is clean afterwards."""
    sem = Semaphore("core", 1, redis=proxy.url(0), key_prefix=chaos.env.prefix, lease_ttl=30)
    inside = [0]
    worst = [0]
    grants = [0]
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run(n: int) -> None:
        try:
            for i in range(60):
                ticket, claim = f"t{n}-{i}", f"c{n}-{i}"
                attempt = _persist(partial(sem.try_acquire, ticket, claim=claim))
                if attempt.permit is None:
                    continue
                assert attempt.status in (AttemptStatus.GRANTED, AttemptStatus.ALREADY_HELD)
                with lock:
                    inside[0] += 1
                    grants[0] += 1
                    worst[0] = max(worst[0], inside[0])
                with lock:
                    inside[0] -= 1
                token = attempt.permit.token
                assert _persist(partial(sem.release_token, token, claim=claim))
        except BaseException as exc:
            errors.append(exc)

    proxy.set_mode("cut", p=0.2)
    cuts = proxy.cuts
    threads = [threading.Thread(target=run, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    proxy.set_mode("pass")
    assert not errors, errors[:3]
    assert proxy.cuts > cuts
    assert grants[0] > 10
    assert worst[0] == 1
    snap = sem.inspect()
    assert (snap.used, snap.holders, snap.waiters) == (0, [], [])


def test_noscript_after_script_flush(
    chaos: Chaos, own_redis: RedisServer, cluster: tuple[Chaos, list[Worker]]
) -> None:
    chaos.load(16, 0.2)
    admin = own_redis.client(0)
    try:
        for _ in range(5):
            wait_until(lambda: chaos.running(), 60, what="bodies run")
            admin.script_flush()
            time.sleep(0.3)  # spread the flushes over the run
    finally:
        admin.close()
    report = chaos.assert_promise(cluster[1], results_within=90)
    assert report.states["SUCCESS"] == 16


def test_clock_jump_on_the_worker_host(chaos: Chaos, cluster: tuple[Chaos, list[Worker]]) -> None:
    """The workers' clock (the package's clock seam) jumps an hour ahead mid-run.  Leases
    are timed by the Redis server's clock: none is lost, none outlives lease_ttl."""
    nodes = cluster[1]
    chaos.load(6, 1.5)
    wait_until(lambda: len(chaos.running()) == 2, 60, what="two bodies run")
    (chaos.dir / "clock-skew").write_text("3600")
    wait_until(lambda: len(chaos.running()) == 0, 60, what="the bodies finish")
    chaos.load(6, 1.5)
    for _ in range(10):
        for h in chaos.semaphore().holders():
            assert 0 < h.lease_remaining <= LEASE
        time.sleep(0.3)
    report = chaos.assert_promise(nodes, results_within=90)
    assert report.states["SUCCESS"] == 12
    assert "permit LOST" not in _logs(nodes)
