"""The heartbeat thread: keeps leases alive, reports lost ones, survives errors.

(Its start-after-fork behaviour is exercised by the prefork worker tests in tests/integration.)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import ConstantBackoff, NoBackoff
from redis.retry import Retry

from celery_semaphore import Permit, Semaphore
from celery_semaphore.integration import events
from celery_semaphore.integration.heartbeat import Heartbeat
from celery_semaphore.ops.testing import RedisServer
from tests.chaos.proxy import Proxy
from tests.conftest import SemaphoreFactory
from tests.log_records import LogRecords, containing


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


@pytest.fixture
def heartbeat_records() -> Iterator[LogRecords]:
    handler = LogRecords()
    logger = logging.getLogger("celery_semaphore")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _unreachable(name: str, client: redis.Redis | None = None) -> Semaphore:
    """A semaphore whose Redis refuses connections; each failing call takes about 0.1 s (one
    retry after 0.1 s), like a client with retries configured."""
    if client is None:
        client = redis.Redis(
            port=1, socket_connect_timeout=0.05, retry=Retry(ConstantBackoff(0.1), 1)
        )
    return Semaphore(name, 1, redis=client, lease_ttl=1.0)


def test_a_slow_sweep_never_holds_up_a_lease_refresh(
    make_semaphore: SemaphoreFactory, heartbeat_records: LogRecords
) -> None:
    """Forty semaphores on forty unreachable Redis clients take about 4 s to sweep; a lease
    of 0.6 s refreshed every 0.2 s must live through it (the sweep works in slices)."""
    sem = make_semaphore("hb-slices", 1, lease_ttl=0.6)
    beat = Heartbeat()
    dead = [_unreachable(f"hb-dead-{i}") for i in range(40)]
    permit = sem.acquire(blocking=False)
    assert permit is not None
    try:
        beat.register(permit, interval=0.2, task_id="t-slices")
        for other in dead:
            beat.watch(other)
        # one whole round of the sweep: every unreachable semaphore has failed once
        assert heartbeat_records.wait_count(containing("sweep failed"), len(dead), 30)
        assert not permit.lost
        assert [h.token for h in sem.holders()] == [permit.token]
    finally:
        for other in dead:
            beat.unwatch(other)
        beat.unregister(permit)
    assert heartbeat_records.count(containing("permit LOST")) == 0
    assert permit.release()


def test_a_failing_redis_costs_one_call_per_sweep(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis, heartbeat_records: LogRecords
) -> None:
    """Thirty names on one unreachable Redis: the sweep tries it once a round and goes on to
    the semaphores whose Redis answers (a stray lease there is taken back)."""
    client = redis.Redis(port=1, socket_connect_timeout=0.05, retry=Retry(ConstantBackoff(0.1), 1))
    dead = [_unreachable(f"hb-down-{i}", client) for i in range(30)]
    healthy = make_semaphore("hb-healthy", 1, lease_ttl=0.3)
    beat = Heartbeat()
    try:
        for other in dead:
            beat.watch(other)
        watched_healthy = make_semaphore("hb-healthy", 1, lease_ttl=0.3)
        beat.watch(watched_healthy)  # swept after the thirty
        assert healthy.acquire(blocking=False) is not None  # a holder that never refreshes
        assert heartbeat_records.wait_count(
            containing("reclaimed 1 permit(s) whose lease expired"), 1, 10
        )
        rounds = heartbeat_records.count(containing("sweep failed"))
        # about one failed call per round (a round a second), never one per name
        assert 1 <= rounds < len(dead), rounds
        assert healthy.holders() == []
    finally:
        for other in dead:
            beat.unwatch(other)
        beat.unwatch(watched_healthy)


def test_a_permit_taken_again_after_its_state_was_lost_keeps_its_partition_and_owner(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    """After Redis lost a semaphore's state, a running body takes its permit again (the
    re-assert) in its own partition, under its cap, with its owner and lease: not in the
    default partition, where the partition's cap would no longer count it (issue 17)."""
    sem = make_semaphore("hb-reassert", 2, lease_ttl=30)
    fair: dict[str, Any] = {"weight": 1, "partition": "bulk", "partition_cap": 1}
    owner: dict[str, Any] = {"task_id": "t1", "pid": 1, "claim": "mine"}
    attempt = sem.try_acquire("t1:0", claim="mine", owner=owner, lease_ttl=30, **fair)
    assert attempt.permit is not None
    beat = Heartbeat()
    beat.register(
        attempt.permit,
        interval=10,
        task_id="t1",
        reacquire={**fair, "owner": owner, "lease_ttl": 30},
    )
    redis_client.delete(*sem.keys.state_keys())  # the state is lost
    beat._reassert_all(sem)
    [holder] = sem.holders()
    assert (holder.token, holder.partition) == ("t1:0", "bulk")
    assert holder.owner["claim"] == "mine"
    assert holder.owner["reasserted"] is True
    # the partition's cap counts it again: a second bulk task waits
    other = sem.try_acquire("t2:0", place_ttl=5, **fair)
    assert other.permit is None
    beat.unregister(attempt.permit)
    sem.withdraw("t2:0")
    assert attempt.permit.release()


def _stray(sem: Semaphore) -> None:
    """A holder of ``sem`` that never refreshes (its lease is ``sem.lease_ttl``)."""
    assert sem.acquire(blocking=False) is not None


def _expired_leases(redis_client: redis.Redis, sem: Semaphore) -> int:
    """Holders still in ``sem``'s state in Redis (read raw: no script, so no reclaim)."""
    return int(redis_client.zcard(sem.keys.expiry))


def test_a_semaphore_this_process_neither_holds_nor_waits_on_is_not_swept(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    """Issue 31: an idle name costs nothing.  The heartbeat runs (it keeps another permit
    alive) and ``idle`` was used here, but nobody here holds or waits on it: its expired lease
    stays in Redis (the next script for the name takes it back) until a task waits for it
    here; then the sweep takes it back within about a second."""
    busy = make_semaphore("hb-busy", 1, lease_ttl=3)
    idle = make_semaphore("hb-idle", 1, lease_ttl=0.3)
    beat = Heartbeat()
    held = busy.acquire(blocking=False)
    assert held is not None
    try:
        beat.register(held, interval=1.0)
        _stray(idle)
        time.sleep(2.0)  # the lease expired long ago, and two rounds of the sweep passed
        assert [s.name for s in beat.active()] == ["hb-busy"]
        assert _expired_leases(redis_client, idle) == 1, "an idle name was swept"
        beat.waited(idle, seconds=30)  # a task waits for it here (parked, held, in a slot)
        assert {s.name for s in beat.active()} == {"hb-busy", "hb-idle"}
        deadline = time.monotonic() + 5
        while _expired_leases(redis_client, idle) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _expired_leases(redis_client, idle) == 0, "the waited-on name was not swept"
    finally:
        beat.unregister(held)
        beat.unwatch(idle)
    assert held.release()


def test_the_names_swept_are_those_held_waited_on_or_named_by_a_source(
    make_semaphore: SemaphoreFactory,
) -> None:
    a, b, c, d = (make_semaphore(f"hb-active-{n}", 2, lease_ttl=5) for n in "abcd")
    beat = Heartbeat()
    assert beat.active() == []
    permit = a.acquire(blocking=False)
    assert permit is not None
    beat.register(permit, interval=2.0)
    beat.waited(b, seconds=0.3)
    named: list[Semaphore] = [c]
    beat.add_source(lambda: named)
    beat.watch(d)  # pinned
    assert {s.name for s in beat.active()} == {s.name for s in (a, b, c, d)}
    time.sleep(0.4)  # b's mark ran out; c's source no longer names it; a ends; d unpinned
    named.clear()
    beat.unregister(permit)
    beat.unwatch(d)
    assert beat.active() == []
    assert beat.watched() == []
    assert permit.release()


def test_a_failing_source_does_not_stop_the_sweep(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("hb-source-ok", 1, lease_ttl=5)
    beat = Heartbeat()

    def broken() -> list[Semaphore]:
        raise RuntimeError("a gate that failed")

    beat.add_source(broken)
    beat.add_source(lambda: [sem])
    assert beat.active() == [sem]


def test_a_forced_release_is_counted_as_a_reclaim_and_an_expired_lease_is_not(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    """The heartbeat that finds its task's permit gone says ``reclaimed`` with reason
    ``forced`` when an operator released it (the reason they left), not otherwise."""
    sem = make_semaphore("hb-forced", 2, lease_ttl=30)
    beat = Heartbeat()
    forced, expired = sem.acquire(blocking=False), sem.acquire(blocking=False)
    assert forced is not None
    assert expired is not None
    seen: list[tuple[str, dict[str, Any]]] = []
    unsubscribe = events.subscribe(lambda kind, fields: seen.append((kind, fields)))
    lost = threading.Semaphore(0)
    try:
        assert sem.release_token(forced.token, timed=False, reason="forced by alice@ops-1")
        redis_client.zadd(sem.keys.expiry, {"h:" + expired.token: 0}, xx=True)
        for permit, task_id in ((forced, "t-forced"), (expired, "t-expired")):
            beat.register(permit, interval=0.05, task_id=task_id, on_lost=lambda p: lost.release())
        assert lost.acquire(timeout=5), "a loss was not reported"
        assert lost.acquire(timeout=5), "a loss was not reported"
    finally:
        unsubscribe()
    reclaims = [f for kind, f in seen if kind == "reclaimed" and f["name"] == "hb-forced"]
    forced_ones = [(f["count"], f["task_id"]) for f in reclaims if f["reason"] == "forced"]
    assert forced_ones == [(1, "t-forced")]  # (the expired lease: reason "expired", by a sweep)
    lost_tasks = {f["task_id"] for kind, f in seen if kind == "lease_lost"}
    assert lost_tasks >= {"t-forced", "t-expired"}


@pytest.fixture
def cut_off(redis_server: RedisServer, key_prefix: str) -> Iterator[tuple[Proxy, Semaphore]]:
    """A semaphore (limit 1, lease 60 s) whose Redis is reached through a proxy that a test
    can make refuse connections (a node cut off), and the proxy."""
    proxy = Proxy(redis_server.port, redis_server.host)
    client = redis.Redis.from_url(
        proxy.url(0), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    try:
        yield proxy, Semaphore("hb-cut", 1, redis=client, key_prefix=key_prefix, lease_ttl=60)
    finally:
        proxy.set_mode("pass")
        client.close()
        proxy.close()


def test_a_failed_refresh_is_tried_again_within_a_second_and_said_once(
    cut_off: tuple[Proxy, Semaphore], heartbeat_records: LogRecords
) -> None:
    """A refresh that fails (Redis unreachable) is tried again a second later, not a whole
    interval later: a body whose permit was taken back while its node was cut off learns it
    about a second after Redis answers again.  The failure is logged once at WARNING."""
    proxy, sem = cut_off
    beat = Heartbeat()
    permit = sem.acquire(blocking=False)
    assert permit is not None
    try:
        proxy.set_mode("refuse")
        beat.register(permit, interval=5.0, task_id="t-retry")  # the first refresh in 5 s
        failed = containing("lease refresh failed")
        assert heartbeat_records.wait_count(failed, 2, 15)  # at 5 s, then about 6 s
        before = permit.lease_expires_at
        proxy.set_mode("pass")
        back = time.monotonic()
        deadline = back + 4.0
        while permit.lease_expires_at == before and time.monotonic() < deadline:
            time.sleep(0.05)
        # an interval-long wait would refresh 4 s after the second failure at the earliest
        assert permit.lease_expires_at > before, "not refreshed within 4 s of Redis coming back"
        assert time.monotonic() - back < 2.5
        said = [r for r in heartbeat_records.records if failed(r)]
        assert [r.levelno for r in said][:2] == [logging.WARNING, logging.DEBUG]
        assert sum(1 for r in said if r.levelno == logging.WARNING) == 1
    finally:
        beat.unregister(permit)
        proxy.set_mode("pass")
        permit.release()


def test_leases_are_refreshed_at_once_when_their_redis_answers_again(
    cut_off: tuple[Proxy, Semaphore], redis_client: redis.Redis, heartbeat_records: LogRecords
) -> None:
    """Cut off from Redis, a process cannot learn that its permit was taken meanwhile (as a
    dead process's is, once its liveness record expires); it learns it at the first refresh
    after Redis is back.  That refresh comes as soon as a sweep finds Redis answering, not at
    the lease's next interval (30 s here)."""
    proxy, sem = cut_off
    beat = Heartbeat()
    permit = sem.acquire(blocking=False)
    assert permit is not None
    lost = threading.Event()
    try:
        beat.register(permit, interval=30.0, task_id="t-back", on_lost=lambda p: lost.set())
        proxy.set_mode("refuse")
        assert heartbeat_records.wait_count(containing("sweep failed"), 1, 10)
        # meanwhile its permit is taken back (fault injected: its lease ends now)
        redis_client.zadd(sem.keys.expiry, {"h:" + permit.token: 0}, xx=True)
        proxy.set_mode("pass")
        back = time.monotonic()
        assert lost.wait(10), "the lost permit was not noticed after Redis came back"
        assert time.monotonic() - back < 3.0
    finally:
        beat.unregister(permit)
