"""Rate windows (``Semaphore(rate=...)``): a start (grant) is admitted only when a unit is free
and every window has room, in the same script; a release gives no start back; a grant of weight
w is w starts; a waiter held by the rate keeps its FIFO place and wakes by itself when its
window opens.

Starts are counted from each grant's own time on the server clock, the one the rate windows
use: a permit's lease expiry less its lease length (both whole milliseconds from the script).
A client timestamp taken after acquire returns trails the grant by a round trip and whatever a
busy CI host adds to it, so two grants a full period apart could look closer than that and fail
a correct rate; the server stamps leave only float rounding, covered by SLACK.
"""

from __future__ import annotations

import itertools
import multiprocessing
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from celery_semaphore import Permit, Rate, Semaphore, SemaphoreGroup
from celery_semaphore.core.semaphore import HANDOFF_MARK, AttemptStatus

SemaphoreFactory = Callable[..., Semaphore]

#: float rounding of server-clock grant stamps (a grant is stamped in whole milliseconds, so a
#: window that admitted one start too many shows a gap a whole period short, far beyond this)
SLACK = 0.002


def granted_at(permit: Permit, lease_ttl: float) -> float:
    """The permit's grant time on the server clock (epoch seconds): its lease expiry, which the
    script set to its ``TIME`` + the lease, less the lease."""
    return permit.lease_expires_at - lease_ttl


def most_in_window(stamps: list[float], period: float) -> int:
    """The most timestamps in any window [t, t + period)."""
    stamps = sorted(stamps)
    most, j = 0, 0
    for i, t in enumerate(stamps):
        while stamps[j] <= t - period:
            j += 1
        most = max(most, i - j + 1)
    return most


# -- across processes ------------------------------------------------------------------------

PROCESSES = 4
RATE = Rate(10, 0.5)
RUN_FOR = 2.5  # seconds each process keeps starting
LEASE = 30.0


def _starter(url: str, prefix: str, out: Any) -> None:
    sem = Semaphore("rated", 100, redis=url, key_prefix=prefix, rate=RATE, lease_ttl=LEASE)
    stamps: list[float] = []
    end = time.monotonic() + RUN_FOR
    try:
        for _ in range(1000):  # bounded: RATE admits about 50 in RUN_FOR across all processes
            remaining = end - time.monotonic()
            if remaining <= 0:
                break
            permit = sem.acquire(timeout=remaining)
            if permit is None:
                break
            stamps.append(granted_at(permit, LEASE))  # the start, on the server clock
            permit.release()
        out.put(("ok", stamps))
    except Exception as exc:  # reported to the test
        out.put(("error", repr(exc)))


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_processes_never_start_more_than_the_rate_in_any_window(
    redis_url: str, key_prefix: str
) -> None:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_starter, args=(redis_url, key_prefix, out), daemon=True)
        for _ in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=40) for _ in procs]
    for p in procs:
        p.join(timeout=10)
    errors = [r for kind, r in results if kind == "error"]
    assert not errors, errors
    stamps = [t for _, got in results for t in got]
    # the rate was the constraint the whole time: about RATE.count per period, never more
    assert most_in_window(stamps, RATE.period_seconds - SLACK) <= RATE.count
    expected = RUN_FOR / RATE.period_seconds * RATE.count
    # each process starts for RUN_FOR from its own start, and spawned processes start up to
    # seconds apart on a loaded machine: the starts span longer than RUN_FOR (67 starts over
    # about 3.3 s once), so the most allowed is counted over the span they cover
    span = max(stamps) - min(stamps)
    allowed = (span / RATE.period_seconds + 1) * RATE.count
    assert 0.6 * expected <= len(stamps) <= allowed, (len(stamps), span)
    assert sum(1 for got in results if got[1]) >= 2  # several processes started bodies


# -- units and rate together; two windows --------------------------------------------------


def _run_threads(
    sem: Semaphore, threads: int, run_for: float, hold: float
) -> tuple[list[float], int]:
    """Threads that acquire, hold, release until run_for passes; grant stamps, peak."""
    lock = threading.Lock()
    stamps: list[float] = []
    current, peak = [0], [0]
    errors: list[BaseException] = []
    end = time.monotonic() + run_for

    def body() -> None:
        try:
            for _ in range(1000):
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return
                permit = sem.acquire(timeout=remaining)
                if permit is None:
                    return
                with lock:
                    stamps.append(granted_at(permit, sem.lease_ttl))  # server clock
                    current[0] += 1
                    peak[0] = max(peak[0], current[0])
                time.sleep(hold)  # the work itself
                with lock:
                    current[0] -= 1
                permit.release()
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=body, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=run_for + 10)
    assert not any(t.is_alive() for t in pool)
    assert not errors, errors
    return stamps, peak[0]


@pytest.mark.timeout(30)
def test_a_concurrency_limit_and_a_rate_hold_together(make_semaphore: SemaphoreFactory) -> None:
    rate = Rate(5, 1.0)
    sem = make_semaphore("both", 2, rate=rate, lease_ttl=30.0)
    # holding 0.3 s, 2 units allow about 6.7 starts/s: the units bind in bursts, the rate
    # (5/s) over time
    stamps, peak = _run_threads(sem, threads=5, run_for=2.2, hold=0.3)
    assert peak == 2
    assert most_in_window(stamps, rate.period_seconds - SLACK) <= rate.count
    assert len(stamps) >= 8


@pytest.mark.timeout(30)
def test_two_windows_hold_together(make_semaphore: SemaphoreFactory) -> None:
    short, long = Rate(3, 0.3), Rate(5, 1.0)
    sem = make_semaphore("two", 50, rate=[long, short], lease_ttl=30.0)
    assert sem.rates == (short, long)  # sorted by period
    stamps, _ = _run_threads(sem, threads=3, run_for=2.2, hold=0.0)
    assert most_in_window(stamps, short.period_seconds - SLACK) <= short.count
    assert most_in_window(stamps, long.period_seconds - SLACK) <= long.count
    # each window was the constraint at some point: a burst of 3, then 5 within a second
    assert most_in_window(stamps, short.period_seconds - SLACK) == short.count
    assert most_in_window(stamps, long.period_seconds - SLACK) == long.count
    assert 8 <= len(stamps) <= 15


# -- fairness and wake-ups -------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_fifo_is_kept_when_the_rate_is_the_constraint_and_nobody_polls(
    make_semaphore: SemaphoreFactory,
) -> None:
    period = 0.3
    # poll_interval 30 s: only the window opening (and the start before) can wake a waiter;
    # nobody releases before the end, and units are plenty: the rate is the only constraint
    sem = make_semaphore("fifo", 10, rate=Rate(1, period), poll_interval=30.0, lease_ttl=30.0)
    first = sem.acquire(blocking=False)
    assert first is not None
    tickets = ["a", "b", "c"]
    for position, ticket in enumerate(tickets):  # places in this order
        attempt = sem.try_acquire(ticket, place_ttl=30.0)
        assert attempt.status is AttemptStatus.WAITING
        assert attempt.position == position
        assert attempt.rate_retry_after is not None
        assert 0 < attempt.rate_retry_after <= period
    order: list[tuple[str, float]] = []
    permits = []
    lock = threading.Lock()
    started = granted_at(first, 30.0)  # the window's one start; the next opens a period later

    def waiter(ticket: str) -> None:
        permit = sem.acquire(ticket=ticket, timeout=10)
        assert permit is not None
        with lock:
            order.append((ticket, granted_at(permit, 30.0) - started))
            permits.append(permit)

    # the threads start in reverse order: the places decide, not who calls first
    pool = [threading.Thread(target=waiter, args=(t,), daemon=True) for t in reversed(tickets)]
    for t in pool:
        t.start()
    late = threading.Thread(target=waiter, args=("late",), daemon=True)
    late.start()  # a newcomer after them waits behind them
    for t in [*pool, late]:
        t.join(timeout=15)
    for permit in [first, *permits]:
        permit.release()
    # the grants' order on the server clock (threads may append in another order, by scheduling)
    order.sort(key=lambda item: item[1])
    assert [ticket for ticket, _ in order] == [*tickets, "late"]
    # one start per window (server stamps: a gap a period short is a window that admitted two);
    # the last grant due 4 periods after the first: 2 s on top for a slow host, while a waiter
    # that missed its window's wake waits for the 30 s poll, or its 10 s timeout
    times = [at for _, at in order]
    assert times[-1] < 4 * period + 2.0, order
    for a, b in itertools.pairwise(times):
        assert b - a >= period - SLACK, order


@pytest.mark.timeout(30)
def test_partitions_keep_fifo_and_shares_when_the_rate_is_the_constraint(
    make_semaphore: SemaphoreFactory,
) -> None:
    period = 0.25
    sem = make_semaphore("parts", 10, rate=Rate(1, period), poll_interval=30.0, lease_ttl=30.0)
    first = sem.acquire(blocking=False)
    assert first is not None
    # all of A's waiters arrive before B's; nobody releases (units are plenty)
    places = [("a1", "A"), ("a2", "A"), ("a3", "A"), ("b1", "B"), ("b2", "B"), ("b3", "B")]
    for ticket, part in places:
        attempt = sem.try_acquire(ticket, place_ttl=30.0, partition=part)
        assert attempt.status is AttemptStatus.WAITING
    granted: list[tuple[float, str]] = []
    permits: list[Permit] = []
    lock = threading.Lock()

    def waiter(ticket: str, part: str) -> None:
        permit = sem.acquire(ticket=ticket, timeout=10, partition=part)
        assert permit is not None
        with lock:  # stamped on the server clock: threads may append in another order
            granted.append((granted_at(permit, 30.0) - started, ticket))
            permits.append(permit)

    started = granted_at(first, 30.0)
    pool = [threading.Thread(target=waiter, args=p, daemon=True) for p in reversed(places)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=15)
    for permit in [first, *permits]:
        permit.release()
    # FIFO within each partition; the next start goes to the partition holding the fewest
    # units, so B is not starved behind A's earlier arrivals
    granted.sort()
    assert [ticket for _, ticket in granted] == ["a1", "b1", "a2", "b2", "a3", "b3"], granted
    # each start soon after its window opened (the last due 6 periods after the first; 2 s on
    # top for a slow host): a waiter that missed its wake waits for the 30 s poll
    assert granted[-1][0] < 6 * period + 2.0, granted


@pytest.mark.timeout(20)
def test_a_waiter_wakes_when_the_window_opens_without_any_release(
    make_semaphore: SemaphoreFactory,
) -> None:
    period = 0.4
    sem = make_semaphore("wake", 5, rate=Rate(1, period), poll_interval=30.0)
    held = sem.acquire(blocking=False)  # the only start of this window; it is never released
    assert held is not None
    permit = sem.acquire(timeout=5)  # no wake-up at the window's opening: the 30 s poll, None
    assert permit is not None
    # on the server clock, from the window's one start: not before the next window, and soon
    # after it opened (1.5 s for a slow host)
    waited = granted_at(permit, sem.lease_ttl) - granted_at(held, sem.lease_ttl)
    assert period - SLACK <= waited <= period + 1.5, waited


# -- weight, releases, snapshot ----------------------------------------------------------------


def test_a_start_of_weight_w_is_w_starts_and_a_release_gives_none_back(
    make_semaphore: SemaphoreFactory,
) -> None:
    sem = make_semaphore("weights", 10, rate="5/m")
    three = sem.acquire(weight=3, blocking=False)
    two = sem.acquire(weight=2, blocking=False)
    assert three is not None
    assert two is not None
    assert sem.acquire(weight=1, blocking=False) is None  # 3 + 2 = 5 starts: the window is full
    three.release()
    two.release()
    assert sem.acquire(weight=1, blocking=False) is None  # releases gave no start back
    attempt = sem.try_acquire("w", place_ttl=10.0)
    assert attempt.status is AttemptStatus.WAITING
    assert attempt.rate_retry_after is not None
    assert 55 < attempt.rate_retry_after <= 60
    snap = sem.inspect()
    [window] = snap.rates
    assert window.rate == Rate(5, 60.0)
    assert (window.started, window.available) == (5, 0)
    assert 55 < window.opens_in <= 60
    assert snap.used == 0  # units are free: the rate is what holds the waiter
    with pytest.raises(ValueError, match=r"weight=6 .* rate=\['5/m'\].*use a weight from 1 to 5"):
        sem.acquire(weight=6, blocking=False)


def test_without_a_rate_nothing_changes_and_the_last_acquirer_sets_the_rate(
    make_semaphore: SemaphoreFactory, redis_client: Any
) -> None:
    plain = make_semaphore("plain", 2)
    rated = make_semaphore("plain", 2, rate="1/h")
    assert plain.inspect().rates == []
    permit = rated.acquire(blocking=False)
    assert permit is not None
    assert [w.started for w in plain.inspect().rates] == [1]
    assert rated.acquire(blocking=False) is None  # the rate holds, with a unit free
    other = plain.acquire(blocking=False)  # an acquire without rate= clears the stored rate
    assert other is not None
    assert plain.inspect().rates == []
    assert redis_client.hget(plain.keys.state, "rate") is None


def test_a_handoff_is_a_start_and_respects_the_rate(make_semaphore: SemaphoreFactory) -> None:
    handoffs: list[str] = []
    wakes: list[str] = []
    sem = make_semaphore(
        "handoff",
        2,
        rate=Rate(3, 30.0),
        lease_ttl=30.0,
        on_wake=lambda ticket, data: wakes.append(ticket),
        on_handoff=lambda ticket, data, fence, expires, claim: handoffs.append(ticket),
    )
    heavy = sem.try_acquire("h", weight=2)  # both units, and 2 of the window's 3 starts
    assert heavy.permit is not None
    gate = "@gate" + HANDOFF_MARK
    for ticket in ("w1", "w2"):
        claim = "claim-" + ticket
        attempt = sem.try_acquire(
            ticket, place_ttl=30.0, claim=claim, wake_data=gate, owner={"claim": claim}
        )
        assert attempt.status is AttemptStatus.WAITING
    heavy.permit.release()  # frees 2 units, but the window has room for 1 start only
    assert handoffs == ["w1"]  # granted in the release, as a start
    assert wakes == []
    assert [w.started for w in sem.inspect().rates] == [3]
    assert sem.release_token("w1") is True  # a unit is free again; the window is full
    assert handoffs == ["w1"]
    assert wakes == []
    assert [w.ticket for w in sem.waiters()] == ["w2"]


def test_a_group_refuses_a_member_with_a_rate(make_semaphore: SemaphoreFactory) -> None:
    rated = make_semaphore("g-rated", 2, rate="5/s")
    with pytest.raises(ValueError, match="does not set rates yet"):
        SemaphoreGroup([(rated, 1)])


def test_a_group_grant_counts_against_a_stored_rate(make_semaphore: SemaphoreFactory) -> None:
    rated = make_semaphore("g-stored", 5, rate="2/h")
    plain_view = make_semaphore("g-stored", 5)  # the same semaphore, without rate=
    permit = rated.acquire(blocking=False)  # stores the rate, one start
    assert permit is not None
    group = SemaphoreGroup([(plain_view, 1)])
    first = group.acquire(blocking=False)
    assert first is not None  # the second start
    assert group.acquire(blocking=False) is None  # the stored window is full
    assert [w.started for w in rated.inspect().rates] == [2]


# -- spaced rates ----------------------------------------------------------------------------


def _due_times(redis_client: Any, sem: Semaphore) -> list[float]:
    """The starts key's scores, in order: each start's due time (server ms; its floor is the
    server ms of its grant)."""
    return [score for _, score in redis_client.zrange(sem.keys.starts, 0, -1, withscores=True)]


@pytest.mark.timeout(30)
def test_a_spaced_rate_starts_one_at_a_time_and_says_when_the_next_is_due(
    make_semaphore: SemaphoreFactory, redis_client: Any
) -> None:
    rate = Rate(5, 1.0, spaced=True)  # one start every 0.2 s
    sem = make_semaphore("spaced", 10, rate="5/s spaced", poll_interval=30.0, lease_ttl=30.0)
    assert sem.rates == (rate,)
    first = sem.acquire(blocking=False)
    assert first is not None
    # the window has room for 4 more and units are free, but the next start is not due yet
    assert sem.acquire(blocking=False) is None
    head = sem.try_acquire("head", place_ttl=30.0)
    assert head.status is AttemptStatus.WAITING
    assert head.position == 0
    assert head.rate_retry_after is not None
    assert 0 < head.rate_retry_after <= 0.2
    behind = sem.try_acquire("behind", place_ttl=30.0)
    assert behind.position == 1
    assert behind.rate_retry_after is not None  # the next start's time, not its own turn
    assert 0 < behind.rate_retry_after <= 0.2
    [window] = sem.inspect().rates
    assert window.rate == rate
    assert str(window.rate) == "5/s spaced"
    assert (window.started, window.available) == (1, 0)
    assert 0 < window.opens_in <= 0.2
    # nobody polls (30 s) and nobody releases: the head wakes by itself when its start is due
    began = time.monotonic()
    second = sem.acquire(ticket="head", timeout=5)
    assert second is not None
    assert time.monotonic() - began <= 0.2 + 0.3
    # the head's start makes the next one due 0.2 s later: the one behind is told so
    behind = sem.try_acquire("behind", place_ttl=30.0)
    assert behind.status is AttemptStatus.WAITING
    assert behind.position == 0
    assert behind.rate_retry_after is not None
    assert 0.1 < behind.rate_retry_after <= 0.2
    first_at, second_at = _due_times(redis_client, sem)
    assert second_at - first_at >= 200
    held = {h.token: h.acquired_at for h in sem.inspect().holders}
    assert held[second.token] - held[first.token] >= 0.2 - 0.001  # server clock, ms
    for permit in (first, second):
        permit.release()


@pytest.mark.timeout(30)
def test_spaced_starts_keep_their_interval_and_the_exact_rate(
    make_semaphore: SemaphoreFactory, redis_client: Any
) -> None:
    """Starts asked for back to back: each is due period / count after the last, carrying
    the fraction of a ms (10/3 ms here: never rounded up to 4, which would start 250 per
    second instead of 300), and none comes before it is due."""
    rate = Rate(300, 1.0, spaced=True)  # one every 3.33 ms; the window keeps 1 s of starts
    sem = make_semaphore("exact", 10_000, rate=rate, lease_ttl=30.0)
    granted = 0
    end = time.monotonic() + 0.4
    while time.monotonic() < end and granted < 200:
        permit = sem.acquire(blocking=False)
        if permit is not None:
            granted += 1
    due = _due_times(redis_client, sem)
    assert len(due) == granted >= 20
    gaps = [b - a for a, b in itertools.pairwise(due)]
    # (a score near 1.7e12 ms has a precision of 2**-12 ms)
    assert min(gaps) >= 10 / 3 - 0.001, gaps
    # back-to-back starts are due 10/3 ms apart (on the server's clock the grants are then 3
    # or 4 ms apart, 3.33 on average)
    assert any(abs(gap - 10 / 3) < 0.001 for gap in gaps), gaps


@pytest.mark.timeout(30)
def test_spaced_starts_from_several_threads(
    make_semaphore: SemaphoreFactory, redis_client: Any
) -> None:
    rate = Rate(40, 2.0, spaced=True)  # one start every 50 ms; the 2 s window keeps them all
    sem = make_semaphore("threads", 50, rate=rate, lease_ttl=30.0, poll_interval=30.0)
    stamps, _ = _run_threads(sem, threads=4, run_for=1.2, hold=0.0)
    due = _due_times(redis_client, sem)
    assert len(due) == len(stamps)
    gaps = [b - a for a, b in itertools.pairwise(due)]
    assert min(gaps) >= 50 - 0.001, gaps  # never closer than the interval (server clock)
    # 1.2 s at 20/s: at most 25, never a burst of 40 (how many fewer depends on the CPU)
    assert 5 <= len(stamps) <= 25
    # the next start comes when it is due, not at the waiters' 30 s poll (a loaded machine
    # delays the threads a little, so the bound is generous)
    assert statistics.median(gaps) < 50 * 3, gaps


def test_a_heavy_spaced_start_takes_its_weight_in_intervals(
    make_semaphore: SemaphoreFactory,
) -> None:
    sem = make_semaphore("heavy", 10, rate="5/m spaced")  # one start every 12 s
    assert sem.acquire(weight=3, blocking=False) is not None
    attempt = sem.try_acquire("next", place_ttl=10.0)
    assert attempt.rate_retry_after is not None
    assert 35 < attempt.rate_retry_after <= 36  # 3 starts: 3 intervals
    # a plain window would have let 2 more start at once
    assert make_semaphore("heavy-plain", 10, rate="5/m").acquire(weight=3, blocking=False)
    assert make_semaphore("heavy-plain", 10, rate="5/m").acquire(weight=2, blocking=False)


def test_spaced_and_plain_windows_combine(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("mixed", 10, rate=["2/h", "10/s spaced"])
    assert [str(r) for r in sem.rates] == ["10/s spaced", "2/h"]
    assert sem.acquire(blocking=False) is not None
    short, long = sem.inspect().rates
    assert (short.rate.spaced, long.rate.spaced) == (True, False)
    assert short.available == 0  # the spacing holds the next start for 0.1 s
    assert 0 < short.opens_in <= 0.1
    assert (long.available, long.opens_in) == (1, 0.0)


# -- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "error", "match"),
    [
        ("", ValueError, r"rate='' is not accepted: use \"N/period\""),
        ("10", ValueError, r"rate='10' is not accepted: use \"N/period\""),
        ("10/x", ValueError, r"rate='10/x' is not accepted"),
        ("1.5/s", ValueError, r"rate='1.5/s' is not accepted"),
        ("-1/s", ValueError, r"rate='-1/s' is not accepted"),
        ("0/s", ValueError, r"rate='0/s' is not accepted: the count must be an int from 1"),
        ("1/0s", ValueError, r"rate='1/0s' is not accepted: the period's multiple must be >= 1"),
        ("1/2d", ValueError, r"rate='1/2d' is not accepted: it is below one start per day"),
        ("6/7d", ValueError, r"below one start per day"),
        ([], ValueError, r"rate=\[\] is not accepted"),
        (["1/s"] * 9, ValueError, r"use at most 8 windows"),
        (3.5, TypeError, r"rate=3.5 \(float\) is not accepted"),
        ([5], TypeError, r"rate=5 \(int\) is not accepted"),
        ("5/s spacd", ValueError, r"rate='5/s spacd' is not accepted: .*\"5/s spaced\""),
        ("5/s  Spaced", ValueError, r"rate='5/s  Spaced' is not accepted"),
    ],
)
def test_bad_rates_are_refused_naming_the_value(rate: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Semaphore("v", 1, rate=rate, redis="redis://127.0.0.1:1/0")


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: Rate(0, 1.0), ValueError, r"rate=Rate\(count=0, period_seconds=1.0\) .* count"),
        (lambda: Rate(-2, 1.0), ValueError, r"count must be an int from 1"),
        (lambda: Rate(1, 0.0), ValueError, r"period must be a finite number of seconds >= 0.001"),
        (lambda: Rate(1, -1.0), ValueError, r"period must be a finite number"),
        (lambda: Rate(1, float("inf")), ValueError, r"period must be a finite number"),
        (lambda: Rate(1, 2 * 86400.0), ValueError, r"below one start per day"),
        (lambda: Rate(1.5, 1.0), TypeError, r"count must be an int >= 1, got float"),  # type: ignore[arg-type]
        (lambda: Rate(1, "1s"), TypeError, r"period must be a number of seconds"),  # type: ignore[arg-type]
        (lambda: Rate(1, 1.0, spaced=1), TypeError, r"spaced must be True or False, got int 1"),  # type: ignore[arg-type]
    ],
)
def test_bad_rate_objects_are_refused(build: Callable[[], Rate], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        build()


def test_good_rates_parse() -> None:
    sem = Semaphore(
        "v", 1, rate=["1/d", "100/s", "5/10s", Rate(7, 0.25)], redis="redis://127.0.0.1:1/0"
    )
    assert [str(r) for r in sem.rates] == ["7/0.25s", "100/s", "5/10s", "1/d"]
    assert sem.rates[0] == Rate(7, 0.25)
    spaced = Semaphore("v", 1, rate=" 5 / 2m  spaced ", redis="redis://127.0.0.1:1/0").rates
    assert spaced == (Rate(5, 120.0, spaced=True),)
    assert str(spaced[0]) == "5/2m spaced"
    assert spaced[0].interval == 24.0
    assert repr(Rate(7, 0.25)) == "Rate(count=7, period_seconds=0.25)"
    assert Semaphore("v", 1, redis="redis://127.0.0.1:1/0").rates == ()
