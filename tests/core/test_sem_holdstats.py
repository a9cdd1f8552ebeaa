"""The counters the core keeps for operators: ``Snapshot.hold_time_avg`` (a moving average of
hold times, updated by real releases only) and ``Snapshot.reclaimed_total`` (leases taken back
after they expired, by whichever call noticed), for single semaphores and groups."""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from celery_semaphore import Permit, Semaphore, SemaphoreGroup

SemaphoreFactory = Callable[..., Semaphore]


def hold(sem: Semaphore, seconds: float) -> float:
    """Acquire, keep the permit ``seconds`` (wall time), release; the hold as the client timed
    it, from acquire's return to the release call.  The server's hold is never shorter: it
    grants before acquire returns and releases after the call is made."""
    permit = sem.acquire(blocking=False)
    assert permit is not None
    began = time.monotonic()
    time.sleep(seconds)
    held = time.monotonic() - began
    assert permit.release() is True
    return held


def test_no_average_and_no_reclaims_before_anything_happened(
    make_semaphore: SemaphoreFactory,
) -> None:
    sem = make_semaphore("fresh", 2)
    snap = sem.inspect()
    assert snap.hold_time_avg is None
    assert snap.reclaimed_total == 0
    permit = sem.acquire(blocking=False)
    assert permit is not None
    # a grant alone is no hold time yet
    assert sem.inspect().hold_time_avg is None
    permit.release()
    assert sem.inspect().reclaimed_total == 0


def test_the_average_follows_recent_hold_times(make_semaphore: SemaphoreFactory) -> None:
    # a lease far longer than any hold here, however slow the host: no hold is cut short
    sem = make_semaphore("avg", 1, lease_ttl=5.0)
    hold(sem, 0.5)
    first = sem.inspect().hold_time_avg
    assert first is not None
    # the first release sets it (server ms; the client's sleep is a lower bound)
    assert 0.49 <= first < 1.5, first
    holds = [hold(sem, 0.05) for _ in range(8)]
    later = sem.inspect().hold_time_avg
    assert later is not None
    # each release moves it 1/8 of the way to its hold: from the holds as the client timed
    # them (about 0.05 + 0.45 * (7/8)^8 ~ 0.205).  A slow host lengthens the holds, and this
    # follows them; the server's holds are never shorter than the client's (less ms rounding,
    # 5 ms), and up to 0.1 longer on average is allowed for round trips.  An average that stays
    # at the first hold is ~0.3 over; a plain mean of all nine (~0.1) or a faster one is under.
    expected = first
    for held in holds:
        expected += (held - expected) / 8
    assert expected - 0.005 <= later <= expected + 0.1, (first, holds, later)
    assert later < first, (first, later)
    # and longer holds pull it back up
    hold(sem, 0.5)
    assert (sem.inspect().hold_time_avg or 0) > later


def test_a_resent_release_and_a_lost_permit_do_not_count(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    # the permit released in time has a long lease (a slow host cannot make it expire first);
    # the one that must be lost asks for a short one
    sem = make_semaphore("resend", 1, lease_ttl=5.0)
    permit = sem.acquire(blocking=False)
    assert permit is not None
    time.sleep(0.05)
    assert sem.release_token(permit.token) is True
    avg = sem.inspect().hold_time_avg
    assert avg is not None
    time.sleep(0.3)
    # the re-sent call finds the tombstone: reported released, the average unchanged
    assert sem.release_token(permit.token) is True
    assert sem.inspect().hold_time_avg == avg
    # a permit lost to lease expiry: its late release frees nothing and counts no hold
    lost = sem.try_acquire("lost", lease_ttl=0.2).permit
    assert lost is not None
    time.sleep(0.3)
    assert lost.release() is False
    snap = sem.inspect()
    assert snap.hold_time_avg == avg
    assert snap.reclaimed_total == 1
    assert redis_client.hget(sem.keys.state, "hold_avg") == str(round(avg * 1000)).encode()


def test_reclaimed_total_counts_expired_leases_whoever_reclaims(
    make_semaphore: SemaphoreFactory,
) -> None:
    # the permits that must expire ask for a short lease; the others keep the long default, so
    # a slow host cannot make them expire before they are released
    sem = make_semaphore("expired", 2, lease_ttl=5.0)
    other = make_semaphore("expired", 2, lease_ttl=5.0)  # another client object of it
    first = sem.try_acquire("first", lease_ttl=0.2).permit
    second = sem.acquire(blocking=False)
    assert first is not None
    assert second is not None
    assert second.release() is True  # released in time: not a reclaim
    time.sleep(0.3)
    assert sem.inspect().reclaimed_total == 0  # inspection reads, it does not reclaim
    # another caller's acquire takes the expired lease back
    taken = other.acquire(blocking=False)
    assert taken is not None
    snap = other.inspect()
    assert snap.reclaimed_total == 1
    assert [h.token for h in snap.holders] == [taken.token]
    # an explicit reclaim (a worker's sweep) counts too; a reclaim that finds nothing does not
    late = sem.try_acquire("late", lease_ttl=0.2).permit
    assert late is not None
    assert other.reclaim() == 0
    time.sleep(0.3)
    assert other.reclaim() == 1
    assert sem.inspect().reclaimed_total == 2
    assert other.reclaim() == 0
    assert sem.inspect().reclaimed_total == 2
    taken.release()
    assert sem.inspect().reclaimed_total == 2


def test_groups_keep_each_members_counters(make_semaphore: SemaphoreFactory) -> None:
    # leases far longer than the holds, however slow the host (the permit that must expire
    # asks for a short lease of its own, below)
    a = make_semaphore("ga", 2, lease_ttl=5.0)
    b = make_semaphore("gb", 2, lease_ttl=5.0)
    group = SemaphoreGroup([(a, 1), (b, 1)])
    # b alone has some history: a long hold (a second: the group's hold below, 0.05 s, stays
    # shorter on a slow host, so b's average must move down)
    hold(b, 1.0)
    b_avg = b.inspect().hold_time_avg
    assert b_avg is not None
    permit = group.acquire(blocking=False)
    assert permit is not None
    time.sleep(0.05)
    assert permit.release() is True
    a_avg, b_after = a.inspect().hold_time_avg, b.inspect().hold_time_avg
    assert a_avg is not None
    assert b_after is not None
    assert 0.045 <= a_avg < 0.9, a_avg  # a's first release sets it (not b's 1 s)
    assert a_avg < b_after < b_avg  # b moves 1/8 of the way from its own average
    assert permit.release() is False  # released once: nothing changes
    assert (a.inspect().hold_time_avg, b.inspect().hold_time_avg) == (a_avg, b_after)
    # a group permit that expires is reclaimed in every member, each counting one
    lost = group.try_acquire("lost", lease_ttl=0.3).permit
    assert lost is not None
    time.sleep(0.6)  # its lease is over (a sleep lasts at least this long)
    again = group.acquire(blocking=False)  # the group's own acquire reclaims in both
    assert again is not None
    assert (a.inspect().reclaimed_total, b.inspect().reclaimed_total) == (1, 1)
    assert (a.inspect().hold_time_avg, b.inspect().hold_time_avg) == (a_avg, b_after)
    assert lost.release() is False
    again.release()
    assert (a.inspect().reclaimed_total, b.inspect().reclaimed_total) == (1, 1)


def test_a_member_released_alone_counts_in_that_member_only(
    make_semaphore: SemaphoreFactory,
) -> None:
    a = make_semaphore("solo-a", 1)
    b = make_semaphore("solo-b", 1)
    permit = a.acquire(blocking=False)
    assert isinstance(permit, Permit)
    assert permit.release() is True
    assert a.inspect().hold_time_avg is not None
    assert b.inspect().hold_time_avg is None


def test_an_untimed_release_frees_the_units_but_counts_no_hold(
    make_semaphore: SemaphoreFactory,
) -> None:
    sem = make_semaphore("untimed", 1)
    hold(sem, 0.05)
    avg = sem.inspect().hold_time_avg
    assert avg is not None
    # a forced release / a grant given back unused: not a hold of finished work
    permit = sem.acquire(blocking=False)
    assert permit is not None
    time.sleep(0.3)
    assert sem.release_token(permit.token, timed=False) is True
    snap = sem.inspect()
    assert (snap.used, snap.hold_time_avg) == (0, avg)
    # before any timed release there is still no average
    fresh = make_semaphore("untimed-fresh", 1)
    given_back = fresh.acquire(blocking=False)
    assert given_back is not None
    assert fresh.release_token(given_back.token, timed=False) is True
    assert fresh.inspect().hold_time_avg is None
    # groups too
    a = make_semaphore("untimed-a", 1)
    group = SemaphoreGroup([(a, 1), (fresh, 1)])
    gp = group.acquire(blocking=False)
    assert gp is not None
    assert group.release_token(gp.token, timed=False) is True
    assert (a.inspect().hold_time_avg, fresh.inspect().hold_time_avg) == (None, None)
    assert (a.inspect().used, fresh.inspect().used) == (0, 0)
