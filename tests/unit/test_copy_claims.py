"""A copy of a parked task takes back a grant a release handed off to its previous
delivery's place (under that delivery's claim), even when Redis's reply to that give-back is
lost and redis-py sends the call again (real Redis; the lost reply is injected)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery import Celery

from celery_semaphore.core.semaphore import AttemptStatus, Semaphore
from celery_semaphore.integration.asking import ask
from celery_semaphore.integration.locks import semaphore_for
from celery_semaphore.integration.wait_state import CLAIM_CHAIN, WaitState
from celery_semaphore.ops.testing import RedisServer


@pytest.fixture
def sem(redis_server: RedisServer, key_prefix: str) -> Semaphore:
    app = Celery("copy-claims", set_as_current=False)
    app.conf.update(semaphore_redis_url=redis_server.url(0), semaphore_key_prefix=key_prefix)
    found = semaphore_for(app, "api", 1, 30.0)
    assert isinstance(found, Semaphore)
    return found


def _resend_every_release(sem: Semaphore, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each release runs twice, as when its reply is lost on the wire and redis-py sends it
    again; the caller sees the second answer.  Returns the answers of the first runs."""
    real = sem.release_token
    first: list[bool] = []

    def resent(*args: Any, **kwargs: Any) -> bool:
        first.append(real(*args, **kwargs))  # ran on the server; its reply never arrives
        return real(*args, **kwargs)

    monkeypatch.setattr(sem, "release_token", resent)
    return first


def test_a_copy_takes_back_its_previous_claims_grant_when_the_reply_is_lost(
    sem: Semaphore, monkeypatch: pytest.MonkeyPatch
) -> None:
    before, now = uuid.uuid4().hex, uuid.uuid4().hex
    # the handoff a release made to the place of the delivery that parked (under its claim)
    assert sem.try_acquire("t:0", claim=before).permit is not None
    first = _resend_every_release(sem, monkeypatch)

    attempt = ask(sem, "t:0", WaitState(epoch=1, claim_before=before), claim=now, epoch=1)

    assert first == [True]  # the give-back ran (its answer lost), the re-sent call found nothing
    assert attempt.status is AttemptStatus.GRANTED
    assert attempt.permit is not None
    holders = sem.holders()
    assert [h.token for h in holders] == ["t:0"]
    assert attempt.permit.release()
    assert not sem.holders()


def test_a_copy_leaves_alone_a_grant_held_under_another_live_claim(
    sem: Semaphore, monkeypatch: pytest.MonkeyPatch
) -> None:
    before, live, now = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
    held = sem.try_acquire("t:0", claim=live)  # another copy of the execution runs it
    assert held.permit is not None
    first = _resend_every_release(sem, monkeypatch)

    attempt = ask(sem, "t:0", WaitState(epoch=1, claim_before=before), claim=now, epoch=1)

    assert first == [False]
    assert attempt.status is AttemptStatus.HELD_ELSEWHERE
    assert held.permit.refresh()  # still the live copy's
    assert held.permit.release()


def test_a_copy_takes_back_a_grant_of_an_earlier_delivery_that_a_failed_one_could_not(
    sem: Semaphore,
) -> None:
    """Delivery 2's grant was made but its reply lost (it parked); delivery 3 failed in Redis
    before it gave that grant back, and parked under its own claim.  Delivery 4 still finds
    the grant under delivery 2's claim, through the chain its wait state carries (the chaos
    test test_connections_dropped_mid_script lost a task this way: the copy took the grant
    for a live copy's and dropped)."""
    second, third, fourth = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
    assert sem.try_acquire("t:0", claim=second).permit is not None  # its reply was lost
    parked_by_second = WaitState(epoch=2, claim_before=uuid.uuid4().hex)
    parked_by_third = WaitState(
        epoch=3, claim_before=third, claims_earlier=(second, *parked_by_second.parked_claims())
    )
    on_the_wire = WaitState.from_headers(parked_by_third.header(0), 0)
    assert on_the_wire == parked_by_third

    attempt = ask(sem, "t:0", on_the_wire, claim=fourth, epoch=3)

    assert attempt.status is AttemptStatus.GRANTED
    assert attempt.permit is not None
    assert attempt.permit.release()
    assert not sem.holders()


def test_the_claims_a_copy_carries_are_bounded() -> None:
    claims = [uuid.uuid4().hex for _ in range(3 * CLAIM_CHAIN)]
    state = WaitState(epoch=1, claim_before=claims[0], claims_earlier=tuple(claims[1:]))
    read = WaitState.from_headers(state.header(0), 0)
    assert read.parked_claims() == tuple(claims[:CLAIM_CHAIN])
    assert WaitState.from_headers({**state.header(0), "pe": "not a list"}, 0).claims_earlier == ()
