"""Leases and places expire on the Redis server's clock, with millisecond precision."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest
import redis

from celery_semaphore import AttemptStatus, Semaphore
from celery_semaphore.core import clock
from celery_semaphore.core._scripts import OPERATIONS, source

SemaphoreFactory = Callable[..., Semaphore]


def test_unrefreshed_lease_is_reclaimed(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("lease", 1, lease_ttl=0.05)
    permit = sem.acquire(blocking=False)
    assert permit is not None
    assert sem.acquire(blocking=False) is None  # still held
    time.sleep(0.07)
    other = sem.acquire(blocking=False)
    assert other is not None, "the expired lease was not reclaimed"
    assert other.fencing_token > permit.fencing_token
    assert [h.token for h in sem.holders()] == [other.token]

    assert permit.refresh() is False
    assert permit.lost is True
    # the lost permit's release frees nothing: the newcomer keeps its unit
    assert permit.release() is False
    assert [h.token for h in sem.holders()] == [other.token]
    assert sem.available() == 0


def test_an_acquire_that_takes_back_an_expired_lease_says_so_once(
    make_semaphore: SemaphoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Nobody else will say it: the script that took the lease back ran for this acquire."""
    sem = make_semaphore("lease-said", 2, lease_ttl=0.05)
    first, second = sem.acquire(blocking=False), sem.acquire(blocking=False)
    assert first is not None
    assert second is not None
    time.sleep(0.07)

    def said() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING and "whose lease expired" in r.getMessage()
        ]

    with caplog.at_level(logging.WARNING, logger="celery_semaphore.semaphore"):
        taken = sem.acquire(blocking=False)
        assert taken is not None
        assert len(said()) == 1
        assert "] reclaimed 2 permit(s) whose lease expired" in said()[0]
        assert taken.release() is True
        assert sem.acquire(blocking=False) is not None  # nothing expired: nothing said
        assert len(said()) == 1


def test_refreshed_lease_is_kept(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("lease-kept", 1, lease_ttl=0.15)
    permit = sem.acquire(blocking=False)
    assert permit is not None
    first_expiry = permit.lease_expires_at
    started = time.monotonic()
    while time.monotonic() - started < 0.45:  # three lease lengths
        assert permit.refresh() is True
        assert sem.acquire(blocking=False) is None
        time.sleep(0.02)
    assert permit.lost is False
    assert permit.lease_expires_at > first_expiry
    assert [h.token for h in sem.holders()] == [permit.token]
    assert permit.release() is True
    assert sem.available() == 1


def test_refresh_with_longer_ttl_outlives_default(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("lease-longer", 1, lease_ttl=0.05)
    permit = sem.acquire(blocking=False)
    assert permit is not None
    assert permit.refresh(lease_ttl=5.0) is True
    time.sleep(0.08)
    assert sem.acquire(blocking=False) is None
    (holder,) = sem.holders()
    assert 4.0 < holder.lease_remaining <= 5.0


def test_expired_place_no_longer_blocks_the_line(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("place", 1)
    holder = sem.acquire(blocking=False)
    assert holder is not None
    ticket = sem.new_ticket()
    attempt = sem.try_acquire(ticket, place_ttl=0.05)
    assert attempt.status is AttemptStatus.WAITING
    assert holder.release() is True
    # the free unit belongs to the waiter while its place lives ...
    assert sem.acquire(blocking=False) is None
    time.sleep(0.07)
    # ... and to anyone once the place ran out
    assert sem.waiters() == []
    newcomer = sem.acquire(blocking=False)
    assert newcomer is not None
    # the ticket that let its place lapse is at the back of the line now
    late = sem.try_acquire(ticket, place_ttl=5.0)
    assert late.status is AttemptStatus.WAITING
    assert late.position == 0


def test_refreshed_place_is_kept(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("place-kept", 1)
    holder = sem.acquire(blocking=False)
    assert holder is not None
    ticket = sem.new_ticket()
    assert sem.try_acquire(ticket, place_ttl=0.1).status is AttemptStatus.WAITING
    behind = sem.new_ticket()
    assert sem.try_acquire(behind, place_ttl=5.0).status is AttemptStatus.WAITING
    started = time.monotonic()
    while time.monotonic() - started < 0.3:
        assert sem.refresh_token(ticket, place_ttl=0.1) is not None
        time.sleep(0.02)
    assert [w.ticket for w in sem.waiters()] == [ticket, behind]
    assert holder.release() is True
    assert sem.try_acquire(behind, place_ttl=5.0).status is AttemptStatus.WAITING
    assert sem.try_acquire(ticket, place_ttl=0.1).status is AttemptStatus.GRANTED


def test_scripts_read_time_only_from_the_server() -> None:
    prelude = source("acquire").split("\n-- acquire:", 1)[0]
    assert prelude.count("redis.call('TIME')") == 1  # in now_ms()
    for op in OPERATIONS:
        body = source(op)[len(prelude) :]
        assert "TIME" not in body, f"{op}.lua reads time other than through now_ms()"


def test_client_clock_jumps_do_not_affect_leases(
    make_semaphore: SemaphoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    sem = make_semaphore("clock", 1, lease_ttl=5.0)
    real_time, real_monotonic = time.time, clock.monotonic
    jump = 10 * 365 * 24 * 3600.0  # ten years
    monkeypatch.setattr(time, "time", lambda: real_time() + jump)
    monkeypatch.setattr(clock, "monotonic", lambda: real_monotonic() + jump)

    permit = sem.acquire(timeout=1.0)
    assert permit is not None
    before = sem.inspect()
    # the lease is measured on the server's clock, not the (jumped) client clock
    assert abs(permit.lease_expires_at - (before.server_time + 5.0)) < 1.0
    assert abs(before.server_time - real_time()) < 60

    monkeypatch.setattr(time, "time", lambda: real_time() + 2 * jump)
    monkeypatch.setattr(clock, "monotonic", lambda: real_monotonic() + 2 * jump)
    assert sem.acquire(blocking=False) is None
    (holder,) = sem.holders()
    assert holder.token == permit.token
    assert 4.0 < holder.lease_remaining <= 5.0
    assert permit.refresh() is True
    assert permit.release() is True


def test_server_time_matches_redis_time(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    sem = make_semaphore("server-time", 1)
    seconds, micros = redis_client.time()
    assert abs(sem.inspect().server_time - (seconds + micros / 1e6)) < 1.0
