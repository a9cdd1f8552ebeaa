"""A Redis that hangs (its process stopped with SIGSTOP: connections open, no answers) costs a
caller seconds, bounded by the worker defaults of celery_semaphore.connection, not minutes."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator

import pytest

from celery_semaphore import Semaphore, SemaphoreBackendError
from celery_semaphore.core.connection import WORKER_DEFAULTS, check
from celery_semaphore.ops.testing import RedisServer, start_redis_server
from tests.conftest import delete_prefix
from tests.integration import proj
from tests.integration.helpers import inside, max_inside, ran
from tests.integration.workers import Env, start_worker, wait_until

from .servers import require_binaries

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

#: every try waits socket_timeout; between tries the backoff waits at most 0.5 s
BOUND = (WORKER_DEFAULTS["retries"] + 1) * WORKER_DEFAULTS["socket_timeout"] + (
    WORKER_DEFAULTS["retries"] * 0.5
)


@pytest.fixture
def hung() -> Iterator[RedisServer]:
    require_binaries("redis-server")
    server = start_redis_server()
    assert server.process is not None
    try:
        yield server
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


def test_a_hung_redis_fails_an_operation_within_the_bound(hung: RedisServer) -> None:
    assert hung.process is not None
    sem = Semaphore("h", 1, redis=hung.url(0))
    permit = sem.acquire(blocking=False)  # connected while Redis answers
    assert permit is not None
    os.kill(hung.process.pid, signal.SIGSTOP)
    started = time.monotonic()
    with pytest.raises(SemaphoreBackendError, match=r"Redis at redis://127\.0\.0\.1"):
        permit.refresh()
    took = time.monotonic() - started
    assert WORKER_DEFAULTS["socket_timeout"] <= took <= BOUND + 1.0, took


def test_worker_start_check_against_a_hung_redis_only_warns_quickly(
    hung: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    assert hung.process is not None
    os.kill(hung.process.pid, signal.SIGSTOP)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="celery_semaphore.config"):
        check(hung.url(0))
    took = time.monotonic() - started
    # one try, no retries: (retries + 1) x socket_timeout would be 6 s; slack for a loaded host
    assert took < 2 * WORKER_DEFAULTS["socket_timeout"] + 1.0, took
    [record] = caplog.records
    assert "is not reachable now" in record.getMessage()


@pytest.mark.timeout(150)
def test_a_hung_semaphore_redis_does_not_hold_up_unlimited_tasks(
    hung: RedisServer, redis_server: RedisServer
) -> None:
    """The worker's consumer never waits for the semaphores' Redis: with it hung, limited tasks
    received first do not delay the unlimited ones behind them (the gate's arrivals thread is
    the one that waits), and no limited body runs until Redis answers again (fail closed).
    Before the arrivals thread, the consumer waited out each limited message's first attempt
    ((retries + 1) x socket_timeout = 6 s) before it took the next message."""
    assert hung.process is not None
    env = Env(
        redis_url=redis_server.url(0),
        broker_url=redis_server.url(0),
        limit=1,
        extra={"semaphore_redis_url": hung.url(0), "worker_prefetch_multiplier": 4},
    )
    node = start_worker(env, pool="threads", concurrency=4, name="hung")  # Redis answers
    app = env.client_app()
    stopped = False
    try:
        os.kill(hung.process.pid, signal.SIGSTOP)
        stopped = True
        limited = [app.send_task(proj.work.name, (f"l{i}", 0.05)) for i in range(3)]
        sent = time.monotonic()
        free = [app.send_task(proj.unlimited.name, (f"u{i}", 0.05)) for i in range(3)]
        assert [r.get(timeout=60) for r in free] == ["u0", "u1", "u2"]
        took = time.monotonic() - sent
        assert took < 2 * WORKER_DEFAULTS["socket_timeout"], took
        assert ran(env) == []  # fail closed: no limited body ran meanwhile
        os.kill(hung.process.pid, signal.SIGCONT)
        stopped = False
        assert sorted(r.get(timeout=90) for r in limited) == ["l0", "l1", "l2"]
        assert max_inside(env) == 1
        assert inside(env) == 0
        sem = Semaphore("main", env.limit, redis=hung.url(0), key_prefix=env.prefix)
        wait_until(lambda: sem.inspect().holders == [], 10, what="no holders left")
    finally:
        if stopped:
            os.kill(hung.process.pid, signal.SIGCONT)
        node.stop()
        app.close()
        local = redis_server.client(0)
        delete_prefix(local, env.prefix)
        local.delete(env.queue)
        local.close()
