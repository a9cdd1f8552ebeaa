"""What an operator's actions leave for the tasks they act on: the reason of a forced release
(read by the holder's heartbeat), and the wake-up of a waiter withdrawn by someone else."""

from __future__ import annotations

import redis

from celery_semaphore.core.semaphore import GONE_TTL
from tests.conftest import SemaphoreFactory


def test_a_forced_release_leaves_its_reason_for_the_holder(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    sem = make_semaphore("op", 2)
    forced, plain = sem.acquire(), sem.acquire()
    assert forced is not None
    assert plain is not None
    assert sem.release_token(forced.token, timed=False, reason="forced by alice@ops-1")
    assert sem.release_reason(forced.token) == "forced by alice@ops-1"
    ttl = redis_client.pttl(sem.keys.gone(forced.token))
    assert 0 < ttl <= GONE_TTL * 1000
    # no reason given (its own release, or an expired lease): nothing to read
    assert plain.release()
    assert sem.release_reason(plain.token) is None
    assert not forced.refresh()  # the holder finds it gone, and can ask why
    assert sem.inspect().used == 0


def test_withdraw_with_wake_wakes_the_withdrawn_waiter(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    sem = make_semaphore("op", 1)
    assert sem.acquire() is not None
    quiet = sem.try_acquire("quiet:0", place_ttl=60)
    woken = sem.try_acquire("woken:0", place_ttl=60)
    assert quiet.permit is None
    assert woken.permit is None
    assert sem.withdraw("quiet:0")
    assert redis_client.llen(sem.keys.wake("quiet:0")) == 0  # nobody told it
    assert sem.withdraw("woken:0", wake=True)
    assert redis_client.llen(sem.keys.wake("woken:0")) == 1  # its blocking pop returns
    assert sem.waiters() == []
    assert not sem.withdraw("woken:0", wake=True)  # no place: nothing to wake
    assert redis_client.llen(sem.keys.wake("woken:0")) == 1


def test_withdraw_with_wake_hands_a_parked_waiter_to_on_wake(
    make_semaphore: SemaphoreFactory,
) -> None:
    seen: list[tuple[str, str]] = []
    sem = make_semaphore("op", 1, on_wake=lambda ticket, data: seen.append((ticket, data)))
    assert sem.acquire() is not None
    sem.try_acquire("p:0", place_ttl=60, wake_data="copy-of-p")
    assert sem.withdraw("p:0", wake=True)
    assert seen == [("p:0", "copy-of-p")]
