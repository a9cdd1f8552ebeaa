"""Priority inside a line (a bounded time offset) and a bounded line (max_waiting, keep_newest)."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections.abc import Callable

import pytest
import redis

from celery_semaphore import AttemptStatus, Semaphore, SemaphoreFull

SemaphoreFactory = Callable[..., Semaphore]
WAIT = 5.0


def _order(sem: Semaphore) -> list[str]:
    """The waiters' tickets in line order (one partition: by position)."""
    return [w.ticket for w in sorted(sem.waiters(), key=lambda w: w.position)]


def _serve_order(sem: Semaphore, holder: str, tickets: list[str]) -> list[str]:
    """Release ``holder``, then hand the single unit on: who is granted, in turn."""
    served: list[str] = []
    sem.release_token(holder, tombstone_ttl=0)
    while len(served) < len(tickets):
        granted = [
            t
            for t in tickets
            if t not in served and sem.try_acquire(t, place_ttl=30).status is AttemptStatus.GRANTED
        ]
        assert len(granted) == 1, granted
        served.append(granted[0])
        sem.release_token(granted[0], tombstone_ttl=0)
    return served


def test_higher_priority_is_served_first(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("prio", 1, priority_step=60.0)
    assert sem.try_acquire("holder").status is AttemptStatus.GRANTED
    for ticket, priority in (("p0", 0), ("p5", 5), ("p9", 9), ("p5b", 5)):
        attempt = sem.try_acquire(ticket, place_ttl=30, priority=priority)
        assert attempt.status is AttemptStatus.WAITING
    assert _order(sem) == ["p9", "p5", "p5b", "p0"]
    assert {w.ticket: w.priority for w in sem.waiters()} == {"p0": 0, "p5": 5, "p9": 9, "p5b": 5}
    assert _serve_order(sem, "holder", ["p0", "p5", "p9", "p5b"]) == ["p9", "p5", "p5b", "p0"]


def test_blocked_waiters_are_granted_by_priority(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("prio-blocking", 1, poll_interval=5.0)
    first = sem.acquire(blocking=False)
    assert first is not None
    granted: list[int] = []
    lock = threading.Lock()

    def wait(priority: int) -> None:
        with sem.hold(timeout=WAIT * 2, priority=priority), lock:
            granted.append(priority)

    threads = []
    for priority in (0, 3, 9, 1):
        thread = threading.Thread(target=wait, args=(priority,), daemon=True)
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + WAIT
        while len(sem.waiters()) < len(threads):
            assert time.monotonic() < deadline
            time.sleep(0.005)
    first.release()
    for thread in threads:
        thread.join(WAIT * 2)
    assert granted == [9, 3, 1, 0]


def test_the_bound_no_later_arrival_passes_after_nine_steps(
    make_semaphore: SemaphoreFactory,
) -> None:
    """A priority-0 waiter is passed by a priority-9 arrival only within 9 * priority_step."""
    step = 0.2  # the bound: 1.8 s
    sem = make_semaphore("prio-bound", 1, priority_step=step)
    assert sem.try_acquire("holder").status is AttemptStatus.GRANTED
    assert sem.try_acquire("old", place_ttl=30).status is AttemptStatus.WAITING
    # within the bound: a priority-9 arrival right after it stands ahead of it
    assert sem.try_acquire("soon", place_ttl=30, priority=9).status is AttemptStatus.WAITING
    assert _order(sem) == ["soon", "old"]
    time.sleep(9 * step + 0.15)  # past the bound (the server's clock, in ms)
    assert sem.try_acquire("late", place_ttl=30, priority=9).status is AttemptStatus.WAITING
    assert _order(sem) == ["soon", "old", "late"]
    assert _serve_order(sem, "holder", ["late", "old", "soon"]) == ["soon", "old", "late"]


def test_a_kept_place_keeps_its_priority(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("prio-kept", 1)
    assert sem.try_acquire("holder").status is AttemptStatus.GRANTED
    sem.try_acquire("first", place_ttl=30)
    sem.try_acquire("vip", place_ttl=30, priority=9, wake_data="parked")
    # it comes back (a park, a standby, a redelivery) without saying its priority, in
    # another partition even: its place, and so its priority, are kept
    again = sem.try_acquire("vip", place_ttl=30, wake_data="parked-again")
    assert again.status is AttemptStatus.WAITING
    assert again.position == 0
    assert {w.ticket: w.priority for w in sem.waiters()}["vip"] == 9
    moved = sem.try_acquire("vip", place_ttl=30, partition="other")
    assert moved.status is AttemptStatus.WAITING
    assert moved.position == 0
    assert {w.ticket: w.priority for w in sem.waiters()}["vip"] == 9


def test_partitions_still_share_by_weight_with_priorities(
    make_semaphore: SemaphoreFactory,
) -> None:
    """Priority orders a partition's own line; it does not give a partition more units."""
    sem = make_semaphore("prio-parts", 2)
    holders = [sem.try_acquire(f"h{i}") for i in range(2)]
    assert all(a.status is AttemptStatus.GRANTED for a in holders)
    sem.try_acquire("b0", place_ttl=30, partition="b")
    sem.try_acquire("a9", place_ttl=30, partition="a", priority=9)
    sem.try_acquire("a9b", place_ttl=30, partition="a", priority=9)
    sem.release_token("h0", tombstone_ttl=0)
    sem.release_token("h1", tombstone_ttl=0)
    got = {
        t: sem.try_acquire(t, place_ttl=30, partition=p).status
        for t, p in (("a9", "a"), ("a9b", "a"), ("b0", "b"))
    }
    assert got == {
        "a9": AttemptStatus.GRANTED,
        "a9b": AttemptStatus.WAITING,
        "b0": AttemptStatus.GRANTED,
    }


def test_a_line_written_before_priorities_is_read_and_served_first(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    """A place as the previous version stored it (a bare arrival number) still works."""
    sem = make_semaphore("prio-old", 1)
    assert sem.try_acquire("holder").status is AttemptStatus.GRANTED
    now_ms = int(time.time() * 1000)
    owner = json.dumps({"host": "old", "pid": 1})
    redis_client.hset(sem.keys.state, "seq", 7)
    redis_client.hset(sem.keys.state, "w:old", f"1 {now_ms} 0 0 1000 7 0 0 {owner}")
    redis_client.zadd(sem.keys.line, {f"0000{7:015d}old": 0})
    redis_client.zadd(sem.keys.expiry, {"w:old": now_ms + 30_000})
    assert sem.try_acquire("new", place_ttl=30, priority=9).status is AttemptStatus.WAITING
    waiters = {w.ticket: w for w in sem.waiters()}
    assert waiters["old"].priority == 0
    assert waiters["old"].position == 0
    assert waiters["old"].owner == {"host": "old", "pid": 1}
    assert waiters["new"].position == 1
    assert _serve_order(sem, "holder", ["new", "old"]) == ["old", "new"]
    # and leaving the line removes the old-format member too
    assert redis_client.zcard(sem.keys.line) == 0


def test_max_waiting_refuses_a_newcomer_when_full(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("full", 1)
    assert sem.try_acquire("holder").status is AttemptStatus.GRANTED
    for t in ("w1", "w2"):
        assert sem.try_acquire(t, place_ttl=30, max_waiting=2).status is AttemptStatus.WAITING
    full = sem.try_acquire("w3", place_ttl=30, max_waiting=2)
    assert full.status is AttemptStatus.FULL
    assert _order(sem) == ["w1", "w2"]
    # a waiter already in line keeps its place whatever the bound
    assert sem.try_acquire("w2", place_ttl=30, max_waiting=0).status is AttemptStatus.WAITING
    # a free unit is still granted to a newcomer when nobody waits ahead of it
    never = make_semaphore("full-zero", 1)
    assert never.try_acquire("a", place_ttl=30, max_waiting=0).status is AttemptStatus.GRANTED
    assert never.try_acquire("b", place_ttl=30, max_waiting=0).status is AttemptStatus.FULL
    assert never.waiters() == []
    assert sem.inspect().full_total == 1
    assert never.inspect().full_total == 1


def test_max_waiting_counts_the_partition_line(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("full-parts", 1)
    assert sem.try_acquire("holder").status is AttemptStatus.GRANTED
    assert sem.try_acquire("a1", place_ttl=30, partition="a", max_waiting=1).status is (
        AttemptStatus.WAITING
    )
    assert sem.try_acquire("b1", place_ttl=30, partition="b", max_waiting=1).status is (
        AttemptStatus.WAITING
    )
    assert sem.try_acquire("a2", place_ttl=30, partition="a", max_waiting=1).status is (
        AttemptStatus.FULL
    )


def test_blocking_acquire_raises_semaphore_full(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("full-blocking", 1)
    held = sem.acquire(blocking=False)
    assert held is not None
    with pytest.raises(SemaphoreFull) as info, sem.hold(timeout=1, max_waiting=0):
        pass
    assert info.value.name == "full-blocking"
    assert not info.value.dropped
    assert "max_waiting" in str(info.value)
    # non-blocking: no permit, as when there is no room
    assert sem.acquire(blocking=False, max_waiting=0) is None
    held.release()


def _burst(args: tuple[str, str, str, int]) -> list[int]:
    url, prefix, name, n = args
    sem = Semaphore(name, 1, redis=url, key_prefix=prefix)
    return [
        int(sem.try_acquire(sem.new_ticket(), place_ttl=30, max_waiting=3).status) for _ in range(n)
    ]


def test_max_waiting_is_never_exceeded_under_concurrent_callers(
    make_semaphore: SemaphoreFactory, redis_url: str, key_prefix: str
) -> None:
    """16 threads and 4 processes ask at once: exactly max_waiting places are taken."""
    sem = make_semaphore("full-burst", 1)
    assert sem.try_acquire("holder").status is AttemptStatus.GRANTED
    statuses: list[AttemptStatus] = []
    lock = threading.Lock()
    start = threading.Barrier(16)

    def ask() -> None:
        start.wait(WAIT)
        attempt = sem.try_acquire(sem.new_ticket(), place_ttl=30, max_waiting=3)
        with lock:
            statuses.append(attempt.status)

    threads = [threading.Thread(target=ask, daemon=True) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert statuses.count(AttemptStatus.WAITING) == 3
    assert statuses.count(AttemptStatus.FULL) == 13
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        found = pool.map(_burst, [(redis_url, key_prefix, "full-burst", 8)] * 4)
    assert sum(s == AttemptStatus.FULL for got in found for s in got) == 32
    assert len(sem.waiters()) == 3


def test_keep_newest_drops_the_front_waiter(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("newest", 1)
    assert sem.try_acquire("holder").status is AttemptStatus.GRANTED
    for t in ("w1", "w2"):
        sem.try_acquire(t, place_ttl=30, max_waiting=2, keep_newest=True)
    newest = sem.try_acquire("w3", place_ttl=30, max_waiting=2, keep_newest=True)
    assert newest.status is AttemptStatus.WAITING
    assert _order(sem) == ["w2", "w3"]
    # the dropped one learns it, and so does every copy of it (a new execution too: a
    # Celery task's first delivery asks as one on every attempt), without taking a place
    assert sem.try_acquire("w1", place_ttl=30).status is AttemptStatus.DROPPED
    status = sem.try_acquire("w1", place_ttl=30, new_execution=True).status
    assert status is AttemptStatus.DROPPED
    assert _order(sem) == ["w2", "w3"]
    assert sem.inspect().dropped_total == 1


def test_keep_newest_wakes_a_blocked_waiter_with_semaphore_full(
    make_semaphore: SemaphoreFactory,
) -> None:
    sem = make_semaphore("newest-blocked", 1, poll_interval=10.0)
    held = sem.acquire(blocking=False)
    assert held is not None
    errors: list[SemaphoreFull] = []

    def wait() -> None:
        try:
            sem.acquire(timeout=WAIT * 2, max_waiting=1, keep_newest=True)
        except SemaphoreFull as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT
    while not sem.waiters():
        assert time.monotonic() < deadline
        time.sleep(0.005)
    started = time.monotonic()
    assert sem.try_acquire("newer", place_ttl=30, max_waiting=1, keep_newest=True).status is (
        AttemptStatus.WAITING
    )
    thread.join(WAIT)
    # woken, not found at its 10 s poll (3 s: a thread stalled on a loaded host)
    assert time.monotonic() - started < 3.0
    assert len(errors) == 1
    assert errors[0].dropped
    assert _order(sem) == ["newer"]
    held.release()


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"priority": 10}, ValueError, "priority=10 is not accepted: use an int from 0 to 9"),
        ({"priority": -1}, ValueError, "priority=-1"),
        ({"priority": "9"}, TypeError, "priority must be an int from 0 to 9"),
        ({"priority": True}, TypeError, "priority must be an int"),
        ({"max_waiting": -1}, ValueError, "max_waiting=-1 is not accepted"),
        ({"max_waiting": 1.5}, TypeError, "max_waiting must be an int >= 0 or None"),
        ({"keep_newest": 1}, TypeError, "keep_newest must be True or False"),
    ],
)
def test_bad_queue_options_are_refused(
    make_semaphore: SemaphoreFactory,
    options: dict[str, object],
    error: type[Exception],
    words: str,
) -> None:
    sem = make_semaphore("prio-bad", 1)
    with pytest.raises(error, match=words):
        sem.try_acquire("t", place_ttl=1, **options)  # type: ignore[arg-type]
    with pytest.raises(error, match=words):
        sem.acquire(blocking=False, **options)  # type: ignore[arg-type]


def test_bad_priority_step_is_refused(make_semaphore: SemaphoreFactory) -> None:
    with pytest.raises(ValueError, match="priority_step=-1"):
        make_semaphore("prio-step", 1, priority_step=-1)
    with pytest.raises(ValueError, match="priority_step"):
        make_semaphore("prio-step", 1, priority_step=2e9)
