"""Fairness: waiters are served first come, first served; nobody barges; weights wait in line."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from celery_semaphore import AttemptStatus, Permit, Semaphore

SemaphoreFactory = Callable[..., Semaphore]
WAIT = 5.0  # upper bound for any single event wait


def _wait_until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


def _in_line(sem: Semaphore, n: int) -> Callable[[], bool]:
    return lambda: len(sem.waiters()) == n


def _any_granted(waiters: list[_Waiter]) -> Callable[[], bool]:
    return lambda: any(w.granted.is_set() for w in waiters)


class _Waiter(threading.Thread):
    """A thread that blocks in ``acquire`` and holds its permit until told to release."""

    def __init__(self, sem: Semaphore, index: int, *, weight: int = 1) -> None:
        super().__init__(daemon=True, name=f"waiter-{index}")
        self.sem = sem
        self.index = index
        self.weight = weight
        self.granted = threading.Event()
        self.may_release = threading.Event()
        self.permit: Permit | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.permit = self.sem.acquire(weight=self.weight, timeout=WAIT * 2)
            self.granted.set()
            if self.permit is not None:
                self.may_release.wait(WAIT * 2)
                self.permit.release()
        except BaseException as exc:  # reported by the test
            self.error = exc
            self.granted.set()


def test_waiters_are_granted_in_arrival_order(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("fifo", 1, poll_interval=5.0)
    first = sem.acquire(blocking=False)
    assert first is not None
    waiters: list[_Waiter] = []
    try:
        for i in range(6):
            w = _Waiter(sem, i)
            w.start()
            # the next one starts only once this one is visibly in line, so arrival is known
            _wait_until(_in_line(sem, i + 1))
            waiters.append(w)
        assert [x.position for x in sem.waiters()] == list(range(6))

        first.release()
        for i, w in enumerate(waiters):
            # whoever is granted next must be the oldest remaining waiter
            _wait_until(_any_granted(waiters[i:]))
            assert [x.index for x in waiters if x.granted.is_set()] == list(range(i + 1))
            assert w.error is None
            assert w.permit is not None
            assert len(sem.holders()) == 1
            assert len(sem.waiters()) == len(waiters) - i - 1
            w.may_release.set()
        fences = [w.permit.fencing_token for w in waiters if w.permit is not None]
        assert fences == sorted(fences)
        assert fences[0] > first.fencing_token
    finally:
        for w in waiters:
            w.may_release.set()
        for w in waiters:
            w.join(WAIT)
    assert sem.holders() == []
    assert sem.available() == 1


def test_newcomer_cannot_barge_past_an_entitled_waiter(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("barge", 1)
    holder = sem.acquire(blocking=False)
    assert holder is not None
    # an older waiter keeps its place in line (it is not blocking, so nothing races us)
    ticket = sem.new_ticket()
    attempt = sem.try_acquire(ticket, place_ttl=10.0)
    assert attempt.status is AttemptStatus.WAITING
    assert attempt.position == 0

    assert holder.release() is True
    # the unit is free ...
    assert sem.available() == 1
    # ... but it belongs to the waiter: newcomers, blocking or not, with or without a ticket,
    # are refused and leave no trace
    assert sem.acquire(blocking=False) is None
    assert sem.acquire(timeout=0.05) is None
    newcomer = sem.new_ticket()
    assert sem.try_acquire(newcomer).status is AttemptStatus.NOT_QUEUED
    assert sem.try_acquire(newcomer, place_ttl=10.0).status is AttemptStatus.WAITING
    assert [w.ticket for w in sem.waiters()] == [ticket, newcomer]
    assert sem.available() == 1

    granted = sem.try_acquire(ticket, place_ttl=10.0)
    assert granted.status is AttemptStatus.GRANTED
    assert granted.permit is not None
    assert [h.token for h in sem.holders()] == [ticket]
    assert [w.ticket for w in sem.waiters()] == [newcomer]


def test_heavy_head_waiter_is_not_overtaken_by_light_newcomers(
    make_semaphore: SemaphoreFactory,
) -> None:
    sem = make_semaphore("weighted", 3)
    light = sem.acquire(blocking=False)
    assert light is not None
    assert sem.available() == 2

    heavy = sem.new_ticket()
    assert sem.try_acquire(heavy, weight=3, place_ttl=10.0).status is AttemptStatus.WAITING
    # two units are free, yet a stream of weight-1 newcomers may not pass the head
    queued: list[str] = []
    for i in range(10):
        assert sem.acquire(blocking=False) is None, f"newcomer {i} overtook the heavy waiter"
        ticket = sem.new_ticket()
        attempt = sem.try_acquire(ticket, place_ttl=10.0)
        assert attempt.status is AttemptStatus.WAITING
        assert attempt.position == i + 1
        queued.append(ticket)
    assert sem.available() == 2
    assert [w.ticket for w in sem.waiters()] == [heavy, *queued]

    assert light.release() is True
    # the light newcomers still wait: all three units go to the head
    assert sem.try_acquire(queued[0], place_ttl=10.0).status is AttemptStatus.WAITING
    attempt = sem.try_acquire(heavy, weight=3, place_ttl=10.0)
    assert attempt.status is AttemptStatus.GRANTED
    assert attempt.permit is not None
    assert sem.available() == 0
    assert sem.acquire(blocking=False) is None

    assert attempt.permit.release() is True
    # now the queued light ones, in order, three of them
    for ticket in queued[:3]:
        assert sem.try_acquire(ticket, place_ttl=10.0).status is AttemptStatus.GRANTED
    assert sem.try_acquire(queued[3], place_ttl=10.0).status is AttemptStatus.WAITING


def test_blocking_heavy_waiter_gets_units_before_later_light_waiters(
    make_semaphore: SemaphoreFactory,
) -> None:
    sem = make_semaphore("weighted-blocking", 3, poll_interval=5.0)
    holders = [sem.acquire(blocking=False) for _ in range(3)]
    heavy = _Waiter(sem, 0, weight=3)
    lights = [_Waiter(sem, i + 1) for i in range(3)]
    try:
        heavy.start()
        _wait_until(_in_line(sem, 1))
        for n, w in enumerate(lights, start=2):
            w.start()
            _wait_until(_in_line(sem, n))
        # free the units one by one: the light waiters could use each, but must not
        for permit in holders[:2]:
            assert permit is not None
            permit.release()
            time.sleep(0.05)
            assert not any(w.granted.is_set() for w in [heavy, *lights])
        assert holders[2] is not None
        holders[2].release()
        assert heavy.granted.wait(WAIT)
        assert heavy.permit is not None
        assert not any(w.granted.is_set() for w in lights)
        heavy.may_release.set()
        for w in lights:
            assert w.granted.wait(WAIT)
            assert w.permit is not None
    finally:
        for w in [heavy, *lights]:
            w.may_release.set()
        for w in [heavy, *lights]:
            w.join(WAIT)


def test_weight_over_limit_is_rejected(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("too-heavy", 3)
    with pytest.raises(ValueError, match=r"weight=4"):
        sem.acquire(weight=4)
    with pytest.raises(ValueError, match=r"weight=4"):
        sem.acquire(weight=4, blocking=False)
    with pytest.raises(ValueError, match=r"weight=4"):
        sem.try_acquire(sem.new_ticket(), weight=4)
    with pytest.raises(ValueError, match=r"weight=0"):
        sem.acquire(weight=0)
    # a runtime override below the weight: the script refuses, and the message says why
    sem.set_limit_override(2)
    with pytest.raises(ValueError, match=r"weight=3.*limit in force \(2"):
        sem.acquire(weight=3, blocking=False)
    assert sem.waiters() == []
    assert sem.holders() == []
