"""A re-sent script (redis-py retrying after a lost reply) changes nothing the second time;
fencing tokens strictly increase."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Callable

import pytest
import redis

from celery_semaphore import AttemptStatus, Semaphore

SemaphoreFactory = Callable[..., Semaphore]


def _used(client: redis.Redis, sem: Semaphore) -> int:
    return int(client.hget(sem.keys.state, "used") or 0)


def _acquire_args(sem: Semaphore, ticket: str, weight: int, claim: str) -> list[object]:
    # the exact ARGV that try_acquire sends (see acquire.lua)
    numbers = f"{weight} {sem.limit} 60000 0 1000 0 0 -1 1 2000 1 0 0 -1 0"
    return [ticket, numbers, claim, json.dumps({}), "", ""]


def test_resent_acquire_script_is_idempotent(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    sem = make_semaphore("resend", 5)
    args = _acquire_args(sem, "ticket-1", 2, "claim-a")
    first = sem._run("acquire", args)
    second = sem._run("acquire", args)
    assert int(first[0]) == AttemptStatus.GRANTED
    assert int(second[0]) == AttemptStatus.ALREADY_HELD
    assert int(second[1]) == int(first[1])  # the same fencing token
    assert _used(redis_client, sem) == 2
    assert sem.available() == 3
    assert [(h.token, h.weight) for h in sem.holders()] == [("ticket-1", 2)]
    assert int(redis_client.hget(sem.keys.state, "fence") or 0) == 1


def test_try_acquire_same_ticket_and_claim_twice(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    sem = make_semaphore("resend-api", 3)
    ticket = sem.new_ticket()
    first = sem.try_acquire(ticket, weight=2, claim="worker-1")
    again = sem.try_acquire(ticket, weight=2, claim="worker-1")
    assert first.status is AttemptStatus.GRANTED
    assert again.status is AttemptStatus.ALREADY_HELD
    assert first.permit is not None
    assert again.permit is not None
    assert again.permit.fencing_token == first.permit.fencing_token
    assert again.permit.token == first.permit.token == ticket
    assert _used(redis_client, sem) == 2
    assert sem.available() == 1

    # another copy of the same ticket (a duplicate delivery) is refused
    other = sem.try_acquire(ticket, weight=2, claim="worker-2")
    assert other.status is AttemptStatus.HELD_ELSEWHERE
    assert other.permit is None
    assert _used(redis_client, sem) == 2


def test_resent_release_frees_units_once(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    sem = make_semaphore("release-twice", 4)
    keep = sem.acquire(weight=1, blocking=False)
    permit = sem.acquire(weight=2, blocking=False)
    assert keep is not None
    assert permit is not None
    assert sem.available() == 1

    assert sem.release_token(permit.token) is True
    assert sem.available() == 3
    assert _used(redis_client, sem) == 1
    # the re-sent release finds the tombstone: reported done, nothing freed again
    assert sem.release_token(permit.token) is True
    assert sem.available() == 3
    assert _used(redis_client, sem) == 1
    assert [h.token for h in sem.holders()] == [keep.token]

    # only_now: True only for the call that released it (not for a tombstone found)
    assert sem.release_token(permit.token, only_now=True) is False
    fresh = sem.acquire(blocking=False)
    assert fresh is not None
    assert sem.release_token(fresh.token, only_now=True) is True
    assert sem.available() == 3
    # releasing a token that was never granted reports False and frees nothing
    assert sem.release_token("never-granted") is False
    assert _used(redis_client, sem) == 1
    # a Permit object talks to Redis once: its second release reports False
    again = sem.acquire(weight=2, blocking=False)
    assert again is not None
    assert again.release() is True
    assert again.release() is False
    assert again.released is True
    assert sem.available() == 3


def test_tombstone_is_reported_with_check_done(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("done", 1)
    ticket = sem.new_ticket()
    granted = sem.try_acquire(ticket)
    assert granted.status is AttemptStatus.GRANTED
    assert sem.release_token(ticket) is True
    assert sem.try_acquire(ticket, check_done=True).status is AttemptStatus.DONE
    assert sem.holders() == []


def test_fencing_tokens_strictly_increase(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("fence", 3)
    twin = make_semaphore("fence", 3)  # another client object of the same semaphore
    tokens: list[int] = []
    for i in range(20):
        s = sem if i % 2 else twin
        permit = s.acquire(weight=1 + i % 3, blocking=False)
        assert permit is not None
        tokens.append(permit.fencing_token)
        if i % 4 != 3:
            permit.release()
        else:
            # one expired lease in between: its replacement still gets a higher token
            expired = {"h:" + permit.token: 0}
            assert s.client.zadd(s.keys.expiry, expired, xx=True, ch=True) == 1
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens
    assert sem.holders() == []


def test_tombstone_outlives_a_regrant_of_the_same_ticket(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    # A release leaves a tombstone; granting the same ticket again (without check_done) must
    # not erase it: once the new grant's lease is lost, a re-sent release of the first permit
    # still reports success, and check_done still reports DONE.
    sem = make_semaphore("regrant", 2)
    first = sem.try_acquire("T")
    assert first.status is AttemptStatus.GRANTED
    assert sem.release_token("T") is True
    again = sem.try_acquire("T")
    assert again.status is AttemptStatus.GRANTED
    assert again.permit is not None
    assert first.permit is not None
    assert again.permit.fencing_token > first.permit.fencing_token
    assert sem.try_acquire("T", check_done=True).status is AttemptStatus.ALREADY_HELD
    # the second grant's lease runs out and is reclaimed
    assert redis_client.zadd(sem.keys.expiry, {"h:T": 0}, xx=True, ch=True) == 1
    assert sem.reclaim() == 1
    assert sem.holders() == []
    assert _used(redis_client, sem) == 0
    assert sem.release_token("T") is True  # the first release's tombstone
    assert sem.try_acquire("T", check_done=True).status is AttemptStatus.DONE
    assert sem.refresh_token("T") is None  # a tombstone is not a permit
    assert sem.available() == 2


def test_new_tickets_look_like_uuid4_hex() -> None:
    tickets = {Semaphore.new_ticket() for _ in range(1000)}
    assert len(tickets) == 1000
    for ticket in tickets:
        parsed = uuid.UUID(hex=ticket)
        assert parsed.hex == ticket
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_a_copy_that_finds_its_ticket_done_leaves_no_place_behind(
    make_semaphore: SemaphoreFactory,
) -> None:
    """DONE ends the execution: a place the ticket still had is dropped with it, instead of
    standing at the head of the line until it expires (issue 17, found by the model test)."""
    sem = make_semaphore("done-place", 1)
    first = sem.try_acquire("T")
    assert first.permit is not None
    assert first.permit.release()
    blocker = sem.try_acquire("blocker").permit
    assert blocker is not None
    assert sem.try_acquire("T", place_ttl=60).status is AttemptStatus.WAITING  # a place again
    assert sem.try_acquire("T", place_ttl=60, check_done=True).status is AttemptStatus.DONE
    assert sem.waiters() == []
    assert blocker.release()


def test_a_new_execution_of_a_ticket_forgets_that_it_ran(make_semaphore: SemaphoreFactory) -> None:
    """A task id sent again later starts a new execution: its own later copies (check_done)
    must not be answered DONE because of the earlier execution's tombstone."""
    sem = make_semaphore("new-execution", 1)
    first = sem.try_acquire("T")
    assert first.permit is not None
    assert first.permit.release()
    blocker = sem.try_acquire("blocker").permit
    assert blocker is not None
    fresh = sem.try_acquire("T", place_ttl=60, new_execution=True)
    assert fresh.status is AttemptStatus.WAITING
    copy = sem.try_acquire("T", place_ttl=60, check_done=True, epoch=1)
    assert copy.status is AttemptStatus.WAITING, "the new execution's copy was taken as done"
    assert blocker.release()
    granted = sem.try_acquire("T", place_ttl=60, check_done=True, epoch=1)
    assert granted.permit is not None
    assert granted.permit.release()
    with pytest.raises(ValueError, match="not accepted together"):
        sem.try_acquire("U", check_done=True, new_execution=True)
