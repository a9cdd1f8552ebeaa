"""The heartbeat thread: keeps leases alive, reports lost ones, survives errors.

(Its start-after-fork behaviour is exercised by the prefork worker tests in tests/integration.)
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_semaphore import Permit, Semaphore
from celery_semaphore.heartbeat import Heartbeat
from tests.conftest import SemaphoreFactory


def test_keeps_a_lease_alive_far_past_its_ttl(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("hb-alive", 1, lease_ttl=0.3)
    beat = Heartbeat()
    permit = sem.acquire(blocking=False)
    assert permit is not None
    beat.register(permit, interval=0.1, task_id="t1")
    time.sleep(1.5)  # five leases long
    assert sem.acquire(blocking=False) is None  # still held: nobody else gets in
    assert [h.token for h in sem.holders()] == [permit.token]
    assert not permit.lost
    beat.unregister(permit)
    assert permit.release()


def test_reports_a_lost_permit(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    sem = make_semaphore("hb-lost", 1, lease_ttl=30)
    beat = Heartbeat()
    permit = sem.acquire(blocking=False)
    assert permit is not None
    lost = threading.Event()
    # fault injected on purpose: the lease runs out behind the holder's back
    redis_client.zadd(sem.keys.expiry, {"h:" + permit.token: 0}, xx=True)
    with caplog.at_level(logging.ERROR, logger="celery_semaphore.heartbeat"):
        beat.register(permit, interval=0.05, task_id="task-42", on_lost=lambda p: lost.set())
        assert lost.wait(5), "the lost permit was not reported"
    assert permit.lost
    assert any("LOST" in r.getMessage() and "task-42" in r.getMessage() for r in caplog.records)
    assert permit not in beat.held()


def test_survives_redis_errors(make_semaphore: SemaphoreFactory) -> None:
    broken = Semaphore(
        "hb-broken",
        1,
        # no retries: a refresh fails at once (a slow one would stall the shared thread)
        redis=redis.Redis(port=1, socket_connect_timeout=0.05, retry=Retry(NoBackoff(), 0)),
        lease_ttl=0.3,
    )
    good_sem = make_semaphore("hb-good", 1, lease_ttl=0.3)
    beat = Heartbeat()
    bad = Permit(broken, "nobody", 1, 1, 0.0)
    good = good_sem.acquire(blocking=False)
    assert good is not None
    beat.register(bad, interval=0.05)
    beat.register(good, interval=0.1)
    time.sleep(1.2)
    assert beat._thread is not None
    assert beat._thread.is_alive()
    assert not good.lost  # refreshed throughout despite the other permit's errors
    assert good_sem.acquire(blocking=False) is None
    beat.unregister(bad)
    beat.unregister(good)
    good.release()
