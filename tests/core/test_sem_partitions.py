"""Fair sharing among partitions: max-min fair (weighted) shares of the free units, caps, work
conservation, FIFO within a partition, and wake-ups that follow the same rule."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from celery_semaphore import AttemptStatus, PartitionInfo, Permit, Semaphore

SemaphoreFactory = Callable[..., Semaphore]
LONG = 30.0
NEVER = 3600.0  # an aging that never passes during a test


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1.0 when all are equal, 1/n when one has everything."""
    total = sum(values)
    squares = sum(v * v for v in values)
    return 1.0 if squares == 0 else total * total / (len(values) * squares)


def fill(sem: Semaphore, n: int) -> list[Permit]:
    permits = [sem.acquire(blocking=False, partition="filler") for _ in range(n)]
    assert all(p is not None for p in permits)
    return [p for p in permits if p is not None]


@dataclass
class Parked:
    """Parked waiters: wake-ups come to ``on_wake`` and are recorded in order."""

    woken: list[str] = field(default_factory=list)

    def __call__(self, ticket: str, data: str) -> None:
        self.woken.append(ticket)


def queue(sem: Semaphore, ticket: str, partition: str, **options: Any) -> None:
    attempt = sem.try_acquire(
        ticket, place_ttl=LONG, wake_data="parked", partition=partition, **options
    )
    assert attempt.status is AttemptStatus.WAITING, (ticket, attempt)


def test_weighted_shares_are_proportional_and_wakeups_follow_them(
    make_semaphore: SemaphoreFactory,
) -> None:
    parked = Parked()
    sem = make_semaphore("weights", 8, on_wake=parked, aging=NEVER)
    held = fill(sem, 8)
    for i in range(10):
        queue(sem, f"A{i}", "A", partition_weight=3)
    for i in range(10):
        queue(sem, f"B{i}", "B", partition_weight=1)
    for permit in held:
        permit.release()
    # the releases named exactly the waiters the units now belong to: 3:1 by weight
    # (A, B, A, A, A, B, A, A: the lowest used/weight first, ties to the older head)
    assert parked.woken == ["A0", "B0", "A1", "A2", "A3", "B1", "A4", "A5"]
    granted = {"A": 0, "B": 0}
    for ticket in [f"A{i}" for i in range(10)] + [f"B{i}" for i in range(10)]:
        attempt = sem.try_acquire(
            ticket,
            place_ttl=LONG,
            partition=ticket[0],
            partition_weight=3 if ticket[0] == "A" else 1,
        )
        if attempt.status is AttemptStatus.GRANTED:
            granted[ticket[0]] += 1
        else:
            assert attempt.status is AttemptStatus.WAITING
    assert granted == {"A": 6, "B": 2}
    snap = sem.inspect()
    assert snap.used == 8
    by_name = {p.name: p for p in snap.partitions}
    assert by_name["A"] == PartitionInfo("A", 6, 4, None, 3)
    assert by_name["B"] == PartitionInfo("B", 2, 8, None, 1)
    assert "filler" not in by_name  # its holders are gone, and so is its record


def test_a_trickle_gets_its_share_at_once_against_a_flood(make_semaphore: SemaphoreFactory) -> None:
    parked = Parked()
    sem = make_semaphore("trickle", 4, on_wake=parked, aging=NEVER)
    flood = [sem.acquire(blocking=False, partition="flood") for _ in range(4)]
    for i in range(50):
        queue(sem, f"F{i}", "flood")
    queue(sem, "T0", "trickle")  # arrives after 50 flood waiters
    first = flood[0]
    assert first is not None
    first.release()
    # the freed unit is the trickle's: it holds 0 of its share, the flood 3
    assert parked.woken == ["T0"]
    assert sem.try_acquire("F0", place_ttl=LONG, partition="flood").status is (
        AttemptStatus.WAITING
    )
    assert sem.try_acquire("T0", place_ttl=LONG, partition="trickle").status is (
        AttemptStatus.GRANTED
    )
    snap = sem.inspect()
    assert [(p.name, p.used, p.waiters) for p in snap.partitions] == [
        ("flood", 3, 50),
        ("trickle", 1, 0),
    ]
    assert [w.position for w in snap.waiters] == list(range(50))


def test_fifo_within_a_partition_with_zero_inversions(make_semaphore: SemaphoreFactory) -> None:
    parked = Parked()
    sem = make_semaphore("fifo-parts", 3, on_wake=parked, aging=NEVER)
    held = fill(sem, 3)
    arrival: dict[str, list[str]] = {"a": [], "b": [], "c": []}
    weights = {"a": 1, "b": 2, "c": 1}
    for i in range(30):
        part = "abc"[(i * 7) % 3]
        ticket = f"{part}{i}"
        arrival[part].append(ticket)
        queue(sem, ticket, part, weight=weights[part])
    grants: list[str] = []
    permits: list[Permit] = list(held)
    for _ in range(200):  # release one permit, grant whoever was woken, until all are done
        if not permits:
            break
        parked.woken.clear()
        permits.pop(0).release()
        for ticket in list(parked.woken):
            attempt = sem.try_acquire(
                ticket, weight=weights[ticket[0]], place_ttl=LONG, partition=ticket[0]
            )
            assert attempt.status is AttemptStatus.GRANTED, (ticket, attempt)
            assert attempt.permit is not None
            grants.append(ticket)
            permits.append(attempt.permit)
    assert sorted(grants) == sorted(t for ts in arrival.values() for t in ts)
    for part, tickets in arrival.items():
        order = [t for t in grants if t[0] == part]
        inversions = sum(
            1
            for i in range(len(order))
            for j in range(i)
            if tickets.index(order[j]) > tickets.index(order[i])
        )
        assert inversions == 0, (part, order)
    assert sem.inspect().used == 0
    assert sem.inspect().partitions == []


def test_caps_hold_even_when_the_other_partitions_are_idle(
    make_semaphore: SemaphoreFactory,
) -> None:
    sem = make_semaphore("caps", 5)
    a = [sem.acquire(blocking=False, partition="a", partition_cap=2) for _ in range(2)]
    assert all(p is not None for p in a)
    # three units are free and nobody else wants them, yet the cap holds
    assert sem.acquire(blocking=False, partition="a", partition_cap=2) is None
    ticket = sem.new_ticket()
    attempt = sem.try_acquire(ticket, place_ttl=LONG, partition="a", partition_cap=2)
    assert attempt.status is AttemptStatus.WAITING
    assert attempt.position == 0
    # another partition is not held up by the capped one's waiter
    b = [sem.acquire(blocking=False, partition="b") for _ in range(3)]
    assert all(p is not None for p in b)
    snap = sem.inspect()
    assert {p.name: (p.used, p.waiters, p.cap) for p in snap.partitions} == {
        "a": (2, 1, 2),
        "b": (3, 0, None),
    }
    with pytest.raises(ValueError, match=r"weight=3 .*partition_cap=2"):
        sem.acquire(weight=3, partition="a", partition_cap=2)
    first = a[0]
    assert first is not None
    first.release()
    assert sem.try_acquire(ticket, place_ttl=LONG, partition="a", partition_cap=2).status is (
        AttemptStatus.GRANTED
    )


def test_a_lone_partition_may_use_the_whole_limit(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("lone", 4)
    permits = [sem.acquire(blocking=False, partition="solo", partition_weight=1) for _ in range(4)]
    assert all(p is not None for p in permits)
    assert sem.acquire(blocking=False, partition="solo") is None
    assert sem.inspect().partitions == [PartitionInfo("solo", 4, 0, None, 1)]
    # another partition now waits: units go to it as they come back, up to its share
    parked = Parked()
    other = make_semaphore("lone", 4, on_wake=parked, aging=NEVER)
    for i in range(3):
        queue(other, f"O{i}", "other")
    for p in permits[:3]:
        assert p is not None
        assert other.release_token(p.token)  # a client that can wake parked waiters
    # "other" holds 0, 1 then 2 against "solo"'s 3, 2, then 1: it gets all three freed units
    assert parked.woken == ["O0", "O1", "O2"]


def test_a_heavy_head_that_does_not_fit_lets_another_partition_use_the_units(
    make_semaphore: SemaphoreFactory,
) -> None:
    parked = Parked()
    sem = make_semaphore("conserve", 3, on_wake=parked, aging=NEVER)
    held = fill(sem, 3)
    queue(sem, "heavy", "h", weight=3)
    queue(sem, "light", "l", weight=1)
    held[0].release()
    # one unit is free: the heavy head cannot use it, the light partition can
    assert parked.woken == ["light"]


@dataclass
class Load:
    """Threads that acquire in one partition, hold briefly and release, until told to stop;
    every holder is counted in an independent counter (not Redis)."""

    sem: Semaphore
    partition: str
    threads: int
    cap: int | None = None
    hold: float = 0.01
    holding: int = 0
    most: int = 0
    grants: int = 0
    errors: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                permit = self.sem.acquire(
                    timeout=10.0, partition=self.partition, partition_cap=self.cap
                )
                if permit is None:
                    continue
                with self.lock:
                    self.holding += 1
                    self.grants += 1
                    self.most = max(self.most, self.holding)
                time.sleep(self.hold)
                with self.lock:
                    self.holding -= 1
                permit.release()
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)


def run_loads(loads: list[Load], seconds: float, sample: Callable[[], None]) -> None:
    stop = threading.Event()
    threads = [
        threading.Thread(target=load.run, args=(stop,), daemon=True)
        for load in loads
        for _ in range(load.threads)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            sample()
            time.sleep(0.005)
    finally:
        stop.set()
        for t in threads:
            t.join(15.0)
    assert not any(t.is_alive() for t in threads)
    for load in loads:
        assert load.errors == []


def test_flood_and_trickle_share_fairly_under_load(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("flood-trickle", 4, poll_interval=0.5, aging=NEVER)
    flood = Load(sem, "flood", threads=10)
    trickle = Load(sem, "trickle", threads=3)
    held = {"flood": 0.0, "trickle": 0.0}
    samples = 0

    def sample() -> None:
        nonlocal samples
        # only while both partitions have waiters (threads neither holding nor between calls
        # count as waiting: every thread re-acquires at once)
        with flood.lock, trickle.lock:
            f, t = flood.holding, trickle.holding
        if f < flood.threads and t < trickle.threads:
            held["flood"] += f
            held["trickle"] += t
            samples += 1

    run_loads([flood, trickle], 3.0, sample)
    assert samples > 50
    index = jain([held["flood"] / samples, held["trickle"] / samples])
    assert index >= 0.95, (held, samples, index)
    assert trickle.grants > 20
    snap = sem.inspect()
    assert snap.used == 0
    assert snap.holders == []
    assert snap.waiters == []
    assert snap.partitions == []


def test_caps_are_never_exceeded_under_load(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("caps-load", 5, poll_interval=0.5, aging=NEVER)
    capped = Load(sem, "capped", threads=6, cap=2)
    free = Load(sem, "free", threads=2)
    total_most = 0

    def sample() -> None:
        nonlocal total_most
        with capped.lock, free.lock:
            total_most = max(total_most, capped.holding + free.holding)

    run_loads([capped, free], 2.0, sample)
    assert capped.most <= 2
    assert capped.most == 2  # the cap is reached: the test could see a breach
    assert total_most <= 5
    assert capped.grants > 20
    assert free.grants > 20
    assert sem.inspect().used == 0


def test_a_waiter_named_in_a_wakeup_keeps_its_units_against_a_newcomer(
    make_semaphore: SemaphoreFactory,
) -> None:
    parked = Parked()
    sem = make_semaphore("named-keeps", 2, on_wake=parked, aging=NEVER)
    a = [sem.acquire(blocking=False, partition="A") for _ in range(2)]
    queue(sem, "A0", "A", wake_grace=LONG)
    first = a[0]
    assert first is not None
    first.release()
    assert parked.woken == ["A0"]  # the unit is A0's: it is on its way
    # a newcomer in a partition further below its share would be served first by the
    # fair-share order, but the unit was already promised to A0
    newcomer = sem.try_acquire("B0", place_ttl=LONG, partition="B")
    assert newcomer.status is AttemptStatus.WAITING
    assert sem.try_acquire("A0", place_ttl=LONG, partition="A").status is AttemptStatus.GRANTED
    # the next unit freed goes by the fair-share order again: B holds nothing, A two
    parked.woken.clear()
    second = a[1]
    assert second is not None
    second.release()
    assert parked.woken == []  # B0 waits blocked (no wake data): it is pushed, not parked
    assert sem.try_acquire("B0", place_ttl=LONG, partition="B").status is AttemptStatus.GRANTED


def test_aging_reserves_units_for_a_heavy_head_against_a_stream_of_light_ones(
    make_semaphore: SemaphoreFactory,
) -> None:
    aging = 0.3
    parked = Parked()
    sem = make_semaphore("aging", 4, on_wake=parked, aging=aging)
    b = [sem.acquire(blocking=False, partition="B") for _ in range(4)]
    assert all(p is not None for p in b)
    queue(sem, "heavy", "A", weight=3)
    stream = [f"B{i}" for i in range(6)]
    for ticket in stream:
        queue(sem, ticket, "B")

    # young: the heavy head cannot use the one free unit, so B's next waiter gets it
    held = [p for p in b if p is not None]
    held.pop(0).release()
    assert parked.woken == ["B0"]
    granted = sem.try_acquire("B0", place_ttl=LONG, partition="B")
    assert granted.status is AttemptStatus.GRANTED
    assert granted.permit is not None
    held.append(granted.permit)

    time.sleep(aging + 0.1)  # server time passes: the head is aged now
    parked.woken.clear()
    held.pop(0).release()
    # A holds nothing, so it is A's turn, and its aged head reserves the free unit
    assert parked.woken == []
    assert sem.try_acquire("B1", place_ttl=LONG, partition="B").status is AttemptStatus.WAITING
    held.pop(0).release()
    assert parked.woken == []
    assert sem.inspect().used == 2
    held.pop(0).release()  # the third unit comes back: the head fits now
    assert parked.woken == ["heavy"]
    attempt = sem.try_acquire("heavy", weight=3, place_ttl=LONG, partition="A")
    assert attempt.status is AttemptStatus.GRANTED


def test_without_aging_a_heavy_head_is_passed_by_light_ones(
    make_semaphore: SemaphoreFactory,
) -> None:
    parked = Parked()
    sem = make_semaphore("no-aging", 4, on_wake=parked, aging=NEVER)
    held = [sem.acquire(blocking=False, partition="B") for _ in range(4)]
    queue(sem, "heavy", "A", weight=3)
    for i in range(6):
        queue(sem, f"B{i}", "B")
    permits = [p for p in held if p is not None]
    for i in range(6):  # every unit B gives back goes to B's next light waiter
        parked.woken.clear()
        permits.pop(0).release()
        assert parked.woken == [f"B{i}"]
        attempt = sem.try_acquire(f"B{i}", place_ttl=LONG, partition="B")
        assert attempt.permit is not None
        permits.append(attempt.permit)
    assert [w.ticket for w in sem.waiters()] == ["heavy"]
