"""Adaptive limits (``Semaphore(adaptive=True)``, ``throttled()``) and the runtime rate override.

A throttle (the downstream service answered 429/503) pauses new grants for ``retry_after``
(server clock, shared through Redis) and, with ``adaptive=True``, halves the limit once per
congestion episode; successful releases of permits granted after the decrease raise it by one
per limit's worth of units, up to the configured limit.  Grants and concurrency are counted
independently of the library: by the bodies' own timestamps and an in-process counter.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from celery_semaphore import Rate, Semaphore, SemaphoreGroup
from celery_semaphore.core.semaphore import AttemptStatus, Permit

SemaphoreFactory = Callable[..., Semaphore]

#: how much earlier than the pause's end (by the client's clock) a grant may be seen: the
#: server and client clocks advance together, but the call's own timing adds a little
EPS = 0.01


def effective(sem: Semaphore) -> int:
    return sem.inspect().effective_limit


# -- the decrease ------------------------------------------------------------------------------


def test_throttled_halves_the_effective_limit_and_never_below_one(
    make_semaphore: SemaphoreFactory,
) -> None:
    sem = make_semaphore("halve", 8, adaptive=True)
    first = sem.acquire(blocking=False)
    assert first is not None
    result = first.throttled()
    assert result.decreased
    assert (result.effective_limit, result.paused_for, result.throttles_total) == (4, None, 1)
    snap = sem.inspect()
    assert (snap.limit, snap.effective_limit, snap.adaptive_limit, snap.adaptive) == (8, 4, 4, True)
    assert snap.available == 3  # one held, under the lowered limit
    first.release()
    seen = [4]
    for _ in range(5):  # each call made under the lowered limit lowers it again
        permit = sem.acquire(blocking=False)
        assert permit is not None
        result = permit.throttled()
        assert result.decreased
        seen.append(result.effective_limit)
        permit.release(tombstone_ttl=0)
    assert seen == [4, 2, 1, 1, 1, 1]
    one = sem.acquire(blocking=False)
    assert one is not None
    assert sem.acquire(blocking=False) is None  # the effective limit is 1
    one.release()
    assert sem.inspect().throttles_total == 6


def test_a_burst_of_throttles_from_calls_in_flight_lowers_it_once(
    make_semaphore: SemaphoreFactory,
) -> None:
    sem = make_semaphore("burst", 10, adaptive=True)
    permits = [sem.acquire(blocking=False) for _ in range(10)]
    assert all(p is not None for p in permits)
    results: list[Any] = []
    lock = threading.Lock()
    go = threading.Event()

    def refused(permit: Permit) -> None:
        go.wait(5)
        outcome = permit.throttled(retry_after=0.05)
        with lock:
            results.append(outcome)

    pool = [threading.Thread(target=refused, args=(p,), daemon=True) for p in permits if p]
    for t in pool:
        t.start()
    go.set()
    for t in pool:
        t.join(timeout=10)
    # all ten calls were granted before the decrease: the first refusal halves the limit,
    # the other nine belong to the same episode
    assert sum(r.decreased for r in results) == 1
    assert {r.effective_limit for r in results} == {5}
    assert sem.inspect().effective_limit == 5
    assert sem.inspect().throttles_total == 10
    for p in permits:
        assert p is not None
        p.release()
    # released calls granted before the decrease are no successes: still 5
    assert sem.inspect().effective_limit == 5


def test_without_a_permit_the_episode_is_a_time(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("ticketless", 16, adaptive=True)
    assert sem.throttled().decreased
    # within max(retry_after, 1 s, the hold-time average) of the decrease: the same episode
    assert not sem.throttled().decreased
    assert not sem.throttled(retry_after=0.01).decreased
    assert effective(sem) == 8
    time.sleep(1.05)
    assert sem.throttled().decreased
    assert effective(sem) == 4


def test_without_adaptive_a_throttle_pauses_and_counts_but_lowers_nothing(
    make_semaphore: SemaphoreFactory,
) -> None:
    sem = make_semaphore("plain", 4)
    # a pause of 2 s: the checks that it is on, a few calls later, hold on a slow host too
    result = sem.throttled(retry_after=2.0)
    thrown = time.monotonic()  # the pause began before this (and ends 2 s after it began)
    assert not result.decreased
    assert result.effective_limit == 4
    assert result.paused_for is not None
    assert 1.0 < result.paused_for <= 2.0
    snap = sem.inspect()
    assert (snap.effective_limit, snap.adaptive_limit, snap.adaptive) == (4, None, False)
    assert snap.paused_for is not None
    assert snap.throttles_total == 1
    assert snap.last_throttle_age is not None
    assert 0 <= snap.last_throttle_age < 1.0
    assert sem.acquire(blocking=False) is None  # paused
    time.sleep(max(0.0, thrown + 2.0 + 0.05 - time.monotonic()))  # the pause is over
    permit = sem.acquire(blocking=False)
    assert permit is not None
    permit.release()
    snap = sem.inspect()
    assert snap.paused_for is None
    assert snap.throttles_total == 1


# -- the pause ---------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_no_grant_during_the_pause_and_waiters_wake_after_it_without_any_release(
    make_semaphore: SemaphoreFactory,
) -> None:
    # 2 s: long enough that the checks made during it (a sleep's overshoot and a slow host
    # allowed for) come before its end
    pause = 2.0
    # poll_interval 30 s: only the pause's end can wake a waiter (nobody releases until the
    # end); not adaptive, so the limit stays 3 and the pause is the only constraint
    sem = make_semaphore("pause", 3, poll_interval=30.0, lease_ttl=30.0)
    before = time.monotonic()
    result = sem.throttled(retry_after=pause)
    assert result.paused_for is not None
    ends = before + pause  # the pause ends no sooner than this, by the client's clock
    grants_before = sem.inspect().grants_total
    # places in line in this order, during the pause
    for position, ticket in enumerate(["a", "b", "c", "d"]):
        attempt = sem.try_acquire(ticket, place_ttl=30.0)
        assert attempt.status is AttemptStatus.WAITING
        assert attempt.position == position
        assert attempt.rate_retry_after is not None  # the pause: when to come back
        assert 0 < attempt.rate_retry_after <= pause
    got: dict[str, tuple[float, int]] = {}
    lock = threading.Lock()

    def waiter(ticket: str) -> None:
        permit = sem.acquire(ticket=ticket, timeout=10)
        if permit is not None:
            with lock:
                got[ticket] = (time.monotonic(), permit.fencing_token)

    # the threads start in reverse order: the places decide
    pool = [threading.Thread(target=waiter, args=(t,), daemon=True) for t in "dcba"]
    for t in pool:
        t.start()
    assert sem.acquire(blocking=False) is None  # no barging during the pause
    # 0.7 s before the end (a sleep may overshoot): the waiters have been blocked well over
    # a second by then, which is ample time for a wrong grant to show
    time.sleep(max(0.0, ends - 0.7 - time.monotonic()))
    assert not got  # nobody started during the pause ...
    assert sem.inspect().grants_total == grants_before  # ... by the library's count either
    deadline = time.monotonic() + 5
    while len(got) < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.1)
    assert set(got) == {"a", "b", "c"}  # the limit's worth, in line order: "d" still waits
    stamps = sorted(at for at, _ in got.values())
    assert stamps[0] >= ends - EPS, stamps[0] - ends
    # woke by themselves, soon after (1.5 s for a slow host; the poll would take 30 s)
    assert stamps[-1] <= ends + 1.5, stamps[-1] - ends
    assert sem.release_token("a")
    for t in pool:
        t.join(timeout=15)
    assert set(got) == {"a", "b", "c", "d"}
    fences = {ticket: fence for ticket, (_, fence) in got.items()}
    assert fences["d"] == max(fences.values())  # nobody behind passed anyone
    for ticket in "bcd":
        assert sem.release_token(ticket)


@pytest.mark.timeout(30)
def test_partitions_keep_their_shares_across_a_pause(make_semaphore: SemaphoreFactory) -> None:
    pause = 0.4
    sem = make_semaphore("parts", 2, poll_interval=30.0, lease_ttl=30.0)
    sem.throttled(retry_after=pause)
    places = [("a1", "A"), ("a2", "A"), ("a3", "A"), ("b1", "B"), ("b2", "B")]
    for ticket, part in places:
        attempt = sem.try_acquire(ticket, place_ttl=30.0, partition=part)
        assert attempt.status is AttemptStatus.WAITING
    got: list[str] = []
    lock = threading.Lock()

    def waiter(ticket: str, part: str) -> None:
        permit = sem.acquire(ticket=ticket, timeout=5, partition=part)
        if permit is not None:
            with lock:
                got.append(ticket)

    pool = [threading.Thread(target=waiter, args=p, daemon=True) for p in reversed(places)]
    for t in pool:
        t.start()
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # no third grant comes
    # after the pause the two units go to the head of each partition, not to A's first two
    assert sorted(got) == ["a1", "b1"]
    released: set[str] = set()
    deadline = time.monotonic() + 10
    while len(released) < len(places) and time.monotonic() < deadline:
        with lock:
            done = [t for t in got if t not in released]
        for ticket in done:  # each holder finishes; the next in line gets its unit
            assert sem.release_token(ticket)
            released.add(ticket)
        time.sleep(0.01)
    for t in pool:
        t.join(timeout=10)
    assert sorted(got) == sorted(t for t, _ in places)
    assert got.index("a2") < got.index("a3")  # FIFO within a partition


@pytest.mark.timeout(30)
def test_clear_throttle_ends_the_pause_and_the_lowered_limit_and_wakes_the_waiters(
    make_semaphore: SemaphoreFactory,
) -> None:
    sem = make_semaphore("clear", 4, adaptive=True, poll_interval=30.0)
    assert not sem.clear_throttle()  # nothing to clear
    assert sem.throttled(retry_after=3600.0).effective_limit == 2
    got = threading.Event()

    def waiter() -> None:
        permit = sem.acquire(timeout=10)
        if permit is not None:
            got.set()
            permit.release()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    time.sleep(0.2)
    assert not got.is_set()  # paused for an hour
    started = time.monotonic()
    assert sem.clear_throttle()
    assert got.wait(5)
    assert time.monotonic() - started < 1.0  # woken, not polled (poll_interval is 30 s)
    thread.join(timeout=5)
    snap = sem.inspect()
    assert (snap.effective_limit, snap.paused_for, snap.adaptive) == (4, None, False)
    assert snap.throttles_total == 1


# -- the increase ------------------------------------------------------------------------------


def test_aimd_recovers_to_the_configured_limit_and_never_above(
    make_semaphore: SemaphoreFactory,
) -> None:
    sem = make_semaphore("recover", 6, adaptive=True)
    old = [sem.acquire(blocking=False) for _ in range(2)]  # granted before the decrease
    assert sem.throttled().effective_limit == 3
    for p in old:
        assert p is not None
        p.release()
    # a release that ends no finished work is no success
    unused = sem.acquire(blocking=False)
    assert unused is not None
    sem.release_token(unused.token, timed=False)
    seen = []
    for _ in range(20):
        permit = sem.acquire(blocking=False)
        assert permit is not None
        permit.release()
        seen.append(effective(sem))
    # +1 each time the lowered limit's worth of units was released successfully: 3, 4, 5
    assert seen == [3] * 2 + [4] * 4 + [5] * 5 + [6] * 9, seen
    assert sem.inspect().adaptive_limit is None
    assert not sem.inspect().adaptive


def test_recovery_stops_at_the_runtime_override(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("override", 8, adaptive=True)
    assert sem.throttled().effective_limit == 4
    sem.set_limit_override(2)  # below the adaptive limit: the override counts
    snap = sem.inspect()
    assert (snap.limit, snap.effective_limit, snap.adaptive) == (2, 2, False)
    sem.set_limit_override(6)
    assert effective(sem) == 4
    for _ in range(12):
        permit = sem.acquire(blocking=False)
        assert permit is not None
        permit.release()
        assert effective(sem) <= 6
    assert effective(sem) == 6
    assert sem.inspect().adaptive_limit is None  # recovered: the lowered limit is forgotten
    sem.set_limit_override(None)
    assert effective(sem) == 8  # the configured limit, not lowered any more


def test_a_waiter_heavier_than_the_lowered_limit_starts_alone(
    make_semaphore: SemaphoreFactory,
) -> None:
    sem = make_semaphore("heavy", 8, adaptive=True)
    assert sem.throttled().effective_limit == 4
    light = sem.acquire(blocking=False)
    assert light is not None
    attempt = sem.try_acquire("heavy", weight=6, place_ttl=10.0)  # 6 > 4: in line
    assert attempt.status is AttemptStatus.WAITING
    # releases that are no success leave the lowered limit at 4
    assert sem.release_token(light.token, timed=False)
    attempt = sem.try_acquire("heavy", weight=6, place_ttl=10.0)
    assert attempt.status is AttemptStatus.GRANTED  # nothing else held: it starts alone
    assert sem.acquire(blocking=False) is None
    assert sem.release_token("heavy", timed=False)
    again = sem.acquire(weight=6, blocking=False)  # the same without a line
    assert again is not None
    assert sem.acquire(blocking=False) is None
    sem.release_token(again.token, timed=False)
    one = sem.acquire(blocking=False)
    assert one is not None
    assert sem.acquire(weight=4, blocking=False) is None  # not alone now: 1 + 4 > 4
    one.release()
    assert effective(sem) == 4


# -- several clients, concurrency --------------------------------------------------------------


def test_several_clients_share_the_adaptive_state(
    make_semaphore: SemaphoreFactory, redis_url: str, key_prefix: str
) -> None:
    adaptive = make_semaphore("shared", 6, adaptive=True)
    other = Semaphore("shared", 6, redis=redis_url, key_prefix=key_prefix)  # its own client
    assert adaptive.throttled(retry_after=0.2).effective_limit == 3
    snap = other.inspect()
    assert (snap.effective_limit, snap.adaptive) == (3, True)
    assert snap.paused_for is not None
    assert other.acquire(blocking=False) is None  # the pause holds every client
    permit = other.acquire(timeout=2)
    assert permit is not None
    held = [permit, other.acquire(blocking=False), adaptive.acquire(blocking=False)]
    assert all(p is not None for p in held)
    assert other.acquire(blocking=False) is None  # 3 held: the lowered limit, for both
    for p in held:
        assert p is not None
        p.release()  # a non-adaptive client's releases raise it too
    assert effective(adaptive) == 4


def _hammer(
    sem: Semaphore,
    threads: int,
    run_for: float,
    body: Callable[[Permit], None],
    release: Callable[[Permit], object] = Permit.release,
) -> tuple[int, int]:
    """Threads acquire, run ``body`` (counted by an independent counter), ``release``;
    returns the peak number of bodies at once and the number of bodies run."""
    lock = threading.Lock()
    current, peak, runs = [0], [0], [0]
    errors: list[BaseException] = []
    end = time.monotonic() + run_for

    def worker() -> None:
        try:
            for _ in range(10_000):
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return
                permit = sem.acquire(timeout=remaining)
                if permit is None:
                    return
                with lock:
                    current[0] += 1
                    peak[0] = max(peak[0], current[0])
                    runs[0] += 1
                try:
                    body(permit)
                finally:
                    with lock:
                        current[0] -= 1
                    release(permit)
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=run_for + 15)
    assert not any(t.is_alive() for t in pool)
    assert not errors, errors
    return peak[0], runs[0]


@pytest.mark.timeout(60)
def test_the_lowered_limit_is_never_exceeded_by_concurrent_threads(
    make_semaphore: SemaphoreFactory,
) -> None:
    sem = make_semaphore("threads", 8, adaptive=True, lease_ttl=30.0)
    assert sem.throttled().effective_limit == 4
    # releases that count as no success keep the limit at 4 the whole time
    peak, runs = _hammer(
        sem,
        10,
        1.5,
        lambda _: time.sleep(0.01),
        lambda permit: sem.release_token(permit.token, timed=False),
    )
    assert peak == 4, peak
    assert runs > 20
    assert sem.inspect().used == 0
    # now successes: it rises back to 8, never above
    peak, runs = _hammer(sem, 10, 2.0, lambda _: time.sleep(0.01))
    assert peak <= 8
    assert effective(sem) == 8
    assert sem.inspect().used == 0


@pytest.mark.timeout(60)
def test_aimd_settles_near_what_the_downstream_takes(make_semaphore: SemaphoreFactory) -> None:
    """A downstream that refuses a call when more than CAPACITY are in flight: without the
    adaptive limit most calls of 10 threads would be refused; with it few are."""
    capacity = 3
    sem = make_semaphore("downstream", 10, adaptive=True, lease_ttl=30.0)
    lock = threading.Lock()
    inside, refused, calls = [0], [0], [0]

    def call(permit: Permit) -> None:
        with lock:
            inside[0] += 1
            over = inside[0] > capacity
            calls[0] += 1
        try:
            if over:
                with lock:
                    refused[0] += 1
                permit.throttled()  # the downstream's 429
            else:
                time.sleep(0.01)
        finally:
            with lock:
                inside[0] -= 1

    peak, runs = _hammer(sem, 10, 3.0, call)
    assert peak <= 10
    assert runs == calls[0] > 50
    assert refused[0] > 0  # it probed above the capacity ...
    assert refused[0] < 0.35 * calls[0], (refused[0], calls[0])  # ... but rarely
    assert 1 <= effective(sem) <= 2 * capacity


# -- the runtime rate override -----------------------------------------------------------------


def test_the_rate_override_is_obeyed_by_every_client_and_cleared(
    make_semaphore: SemaphoreFactory,
) -> None:
    fast = make_semaphore("rated", 10, rate="100/s")
    plain = make_semaphore("rated", 10)
    assert fast.set_rate_override("2/m") == (Rate(2, 60.0),)
    snap = plain.inspect()
    assert snap.rate_override == [Rate(2, 60.0)]
    assert [w.rate for w in snap.rates] == [Rate(2, 60.0)]
    started = [fast.acquire(blocking=False), plain.acquire(blocking=False)]
    assert all(p is not None for p in started)
    # the acquirers' own rates (100/s, none) are not stored over it
    assert fast.acquire(blocking=False) is None
    assert plain.acquire(blocking=False) is None
    attempt = fast.try_acquire("w", place_ttl=5.0)
    assert attempt.status is AttemptStatus.WAITING
    assert attempt.rate_retry_after is not None
    assert 50 < attempt.rate_retry_after <= 60
    fast.withdraw("w")
    assert fast.inspect().rate_override == [Rate(2, 60.0)]
    assert fast.set_rate_override(None) is None
    assert fast.inspect().rate_override is None
    third = fast.acquire(blocking=False)  # stores its own 100/s again
    assert third is not None
    snap = plain.inspect()
    assert snap.rate_override is None
    assert [w.rate for w in snap.rates] == [Rate(100, 1.0)]
    assert fast.set_rate_override(None) is None  # no override: the acquirer's rate stays
    assert [w.rate for w in plain.inspect().rates] == [Rate(100, 1.0)]
    for p in [*started, third]:
        assert p is not None
        p.release()


# -- groups and bad input ----------------------------------------------------------------------


def test_a_group_refuses_an_adaptive_member_and_a_group_permit_is_not_throttled(
    make_semaphore: SemaphoreFactory,
) -> None:
    adaptive = make_semaphore("ad", 2, adaptive=True)
    plain = make_semaphore("pl", 2)
    with pytest.raises(ValueError, match=r"semaphore 'ad' has adaptive=True"):
        SemaphoreGroup([(adaptive, 1), (plain, 1)])
    other = make_semaphore("pl2", 2)
    group = SemaphoreGroup([(plain, 1), (other, 1)])
    permit = group.acquire(blocking=False)
    assert permit is not None
    with pytest.raises(TypeError, match=r"throttled\(\) is not accepted on a GroupPermit"):
        permit.throttled(1.0)
    # a member's own permit may be: it pauses that member only
    assert permit.permits[0].throttled(0.5).paused_for is not None
    permit.release()
    assert plain.inspect().paused_for is not None
    assert other.inspect().paused_for is None
    assert group.acquire(blocking=False) is None  # the paused member holds the group back


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (-1, ValueError, r"retry_after=-1 is not accepted"),
        (math.nan, ValueError, r"retry_after=nan is not accepted"),
        (math.inf, ValueError, r"retry_after=inf is not accepted"),
        ("5", TypeError, r"retry_after must be a number of seconds >= 0 or None, got str '5'"),
        (True, TypeError, r"retry_after must be a number .* got bool True"),
    ],
)
def test_bad_retry_after_is_refused_naming_it(
    make_semaphore: SemaphoreFactory, value: Any, error: type, match: str
) -> None:
    sem = make_semaphore("bad", 2, adaptive=True)
    with pytest.raises(error, match=match):
        sem.throttled(value)
    assert sem.inspect().throttles_total == 0  # nothing was sent


def test_other_bad_input_is_refused_naming_it(make_semaphore: SemaphoreFactory) -> None:
    with pytest.raises(TypeError, match=r"adaptive must be True or False, got str 'yes'"):
        make_semaphore("bad", 2, adaptive="yes")
    sem = make_semaphore("bad", 2, adaptive=True)
    with pytest.raises(ValueError, match=r"fencing_token=0 is not accepted"):
        sem.throttled(fencing_token=0)
    with pytest.raises(ValueError, match=r"rate='fast' is not accepted"):
        sem.set_rate_override("fast")
    with pytest.raises(ValueError, match=r"rate=\[\] is not accepted"):
        sem.set_rate_override([])
    assert sem.inspect().rate_override is None
