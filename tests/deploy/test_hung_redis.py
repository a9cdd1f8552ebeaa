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
from celery_semaphore.connection import WORKER_DEFAULTS, check
from celery_semaphore.testing import RedisServer, start_redis_server

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
