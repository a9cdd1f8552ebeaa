"""Waiters that are not ready (``try_acquire(ready=False)``): they keep their place and turn in
line, are never granted or woken while so, are passed by later waiters that are ready, and
find their turn again once ready."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from celery_semaphore import AttemptStatus, Semaphore

SemaphoreFactory = Callable[..., Semaphore]
LONG = 30.0
WAITING = AttemptStatus.WAITING


@dataclass
class Woken:
    items: list[tuple[str, str]] = field(default_factory=list)

    def __call__(self, ticket: str, data: str) -> None:
        self.items.append((ticket, data))


def test_free_units_are_not_granted_to_a_waiter_that_is_not_ready(
    make_semaphore: SemaphoreFactory,
) -> None:
    sem = make_semaphore("nr-free", 2)
    attempt = sem.try_acquire("t1", place_ttl=LONG, ready=False)
    assert attempt.status is AttemptStatus.WAITING, attempt
    assert attempt.position == 0
    assert sem.holders() == []
    (waiter,) = sem.waiters()
    assert waiter.ready is False
    assert waiter.parked is False
    # no place asked: nothing is kept, nothing granted
    assert sem.try_acquire("t2", ready=False).status is AttemptStatus.NOT_QUEUED
    assert [w.ticket for w in sem.waiters()] == ["t1"]


def test_a_ready_waiter_passes_one_that_is_not_and_the_first_keeps_its_turn(
    make_semaphore: SemaphoreFactory,
) -> None:
    woken = Woken()
    sem = make_semaphore("nr-pass", 1, on_wake=woken)
    held = sem.acquire(blocking=False)
    assert held is not None
    assert sem.try_acquire("early", place_ttl=LONG, wake_data="e", ready=False).status is WAITING
    assert sem.try_acquire("late", place_ttl=LONG, wake_data="l").status is WAITING
    assert sem.try_acquire("later", place_ttl=LONG, wake_data="x").status is WAITING
    held.release()
    # the unit is for the first ready waiter: "late"; "early" is not named
    assert woken.items == [("late", "l")]
    assert sem.try_acquire("early", place_ttl=LONG, wake_data="e", ready=False).status is WAITING
    granted = sem.try_acquire("late", place_ttl=LONG, wake_data="l")
    assert granted.permit is not None
    # ready again, "early" is ahead of "later": it arrived first
    again = sem.try_acquire("early", place_ttl=LONG, wake_data="e")
    assert again.status is AttemptStatus.WAITING
    assert again.position == 0
    granted.permit.release()
    assert woken.items[-1] == ("early", "e")
    assert sem.try_acquire("early", place_ttl=LONG, wake_data="e").permit is not None
    assert [w.ticket for w in sem.waiters()] == ["later"]


def test_a_waiter_made_ready_at_the_head_with_units_free_is_granted_at_once(
    make_semaphore: SemaphoreFactory,
) -> None:
    sem = make_semaphore("nr-ready", 1)
    assert sem.try_acquire("t", place_ttl=LONG, ready=False).status is WAITING
    attempt = sem.try_acquire("t", place_ttl=LONG)
    assert attempt.permit is not None
    assert sem.waiters() == []


def test_a_release_hands_off_only_to_ready_waiters(make_semaphore: SemaphoreFactory) -> None:
    handed: list[str] = []
    sem = make_semaphore(
        "nr-handoff",
        1,
        on_wake=lambda ticket, data: None,
        on_handoff=lambda ticket, data, fence, expires, claim: handed.append(ticket),
    )
    held = sem.acquire(blocking=False)
    assert held is not None
    owner = {"claim": "c1"}
    wake = "@gate#handoff"
    first = sem.try_acquire("nr", place_ttl=LONG, owner=owner, wake_data=wake, ready=False)
    assert first.status is WAITING
    held.release()
    assert handed == []
    assert sem.holders() == []  # the unit stays free for a waiter that is ready
    assert sem.try_acquire("nr", place_ttl=LONG, owner=owner, claim="c1").permit is not None


def test_wake_data_may_not_start_with_the_not_ready_mark(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("nr-mark", 1)
    with pytest.raises(ValueError, match=r"wake_data='~x' is not accepted"):
        sem.try_acquire("t", place_ttl=LONG, wake_data="~x")
