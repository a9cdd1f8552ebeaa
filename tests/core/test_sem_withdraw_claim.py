"""Withdrawing under a claim: a place belongs to the claim it was last asked under (its
owner's ``"claim"``), and a withdraw under another claim leaves it in line (real Redis)."""

from __future__ import annotations

import redis

from celery_semaphore import AttemptStatus, Semaphore, SemaphoreGroup
from tests.conftest import SemaphoreFactory

LONG = 30.0


def _waiting(lock: Semaphore | SemaphoreGroup, ticket: str, claim: str | None) -> None:
    owner = {} if claim is None else {"claim": claim}
    attempt = lock.try_acquire(ticket, claim=claim or "", owner=owner, place_ttl=LONG)
    assert attempt.status is AttemptStatus.WAITING


def assert_clean(client: redis.Redis, sems: list[Semaphore]) -> None:
    for sem in sems:
        snap = sem.inspect()
        assert (snap.used, snap.holders, snap.waiters) == (0, [], [])
        assert client.zcard(sem.keys.line) == 0


def test_a_withdraw_under_another_claim_leaves_the_place_in_line(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    sem = make_semaphore("wc", 1)
    holder = sem.acquire()
    assert holder is not None
    _waiting(sem, "t:0", "new")
    assert sem.withdraw("t:0", claim="old") is False
    assert [w.ticket for w in sem.waiters()] == ["t:0"]
    _waiting(sem, "t:0", "old")  # asked again under "old": the place is "old"'s now
    assert sem.withdraw("t:0", claim="new") is False
    assert sem.withdraw("t:0", claim="old") is True
    assert sem.waiters() == []
    # a place whose owner names no claim is anyone's, and no claim withdraws any place
    _waiting(sem, "u:0", None)
    assert sem.withdraw("u:0", claim="old") is True
    _waiting(sem, "v:0", "new")
    assert sem.withdraw("v:0") is True
    assert holder.release()
    assert_clean(redis_client, [sem])


def test_a_group_withdraw_under_another_claim_leaves_every_place(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    a, b = make_semaphore("a", 1), make_semaphore("b", 1)
    group = SemaphoreGroup([(a, 1), (b, 1)])
    blockers = [a.acquire(), b.acquire()]
    _waiting(group, "g:0", "new")
    assert group.withdraw("g:0", claim="old") is False
    assert [w.ticket for w in a.waiters()] == ["g:0"]
    assert [w.ticket for w in b.waiters()] == ["g:0"]
    assert group.withdraw("g:0", claim="new") is True
    assert a.waiters() == []
    assert b.waiters() == []
    for permit in blockers:
        assert permit is not None
        assert permit.release()
    assert_clean(redis_client, [a, b])
