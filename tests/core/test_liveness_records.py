"""A process's liveness records: kept while something uses them, and a refresh that keeps
failing is said once a minute, not every interval (a dead server's refresh logged a WARNING
every second: 182 such lines in one run of the suite)."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator

import pytest
import redis

from celery_semaphore import Semaphore
from celery_semaphore.core import liveness
from celery_semaphore.core._scripts import ScriptSet


@pytest.fixture(autouse=True)
def _no_records() -> Iterator[None]:
    liveness.stop()  # no earlier test's records
    yield
    liveness.stop()


def _slots(client: redis.Redis) -> list[str]:
    """The procs keys this process refreshes on ``client``."""
    return [key for (cid, key) in liveness._records if cid == id(client)]


def test_a_record_is_refreshed_while_a_semaphore_uses_it_then_forgotten(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    procs = liveness.procs_key(key_prefix)
    first = Semaphore("a", 2, redis=redis_client, key_prefix=key_prefix, liveness_ttl=30.0)
    second = Semaphore("b", 2, redis=redis_client, key_prefix=key_prefix, liveness_ttl=30.0)
    for sem in (first, second):
        permit = sem.acquire(blocking=False)
        assert permit is not None
        permit.release()
    assert redis_client.zscore(procs, liveness.ident()) is not None
    del first, sem, permit
    gc.collect()
    liveness._in_use()
    assert _slots(redis_client) == [procs]  # the second semaphore still uses it
    del second
    gc.collect()
    liveness._in_use()
    assert _slots(redis_client) == []  # nothing uses it: no refresh, it expires


def test_a_refresh_that_keeps_failing_is_said_once_a_minute_and_when_it_works_again(
    redis_client: redis.Redis, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    scripts = ScriptSet(redis_client)
    procs = liveness.procs_key(key_prefix)
    redis_client.set(procs, "not a zset")  # fault injected: every refresh fails (WRONGTYPE)

    def said(level: int, text: str) -> int:
        return sum(1 for r in caplog.records if r.levelno == level and text in r.getMessage())

    with caplog.at_level(logging.INFO, logger="celery_semaphore.semaphore"):
        liveness.register(scripts, redis_client, procs, 30.0)  # the first refresh fails
        record = liveness._records[(id(redis_client), procs)]
        for _ in range(3):
            liveness._refresh(record)
        assert said(logging.WARNING, "liveness record refresh failed") == 1
        record.warned_at -= liveness.WARN_EVERY  # a minute goes by, still failing
        liveness._refresh(record)
        assert said(logging.WARNING, "liveness record refresh failed") == 2
        redis_client.delete(procs)  # the fault undone
        liveness._refresh(record)
        assert said(logging.INFO, "liveness record refreshed again after") == 1
        liveness._refresh(record)
        assert said(logging.INFO, "liveness record refreshed again after") == 1
    assert said(logging.WARNING, "liveness record refresh failed") == 2
    assert redis_client.zscore(procs, liveness.ident()) is not None
