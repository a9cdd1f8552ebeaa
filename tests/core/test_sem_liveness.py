"""One liveness record per process: the permits of a process that died come back when its
record expires (seconds), not when their leases do; a live process keeps its permits however
long it holds them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis

from celery_semaphore import Semaphore
from celery_semaphore.core import liveness

SemaphoreFactory = Callable[..., Semaphore]
ROOT = Path(__file__).resolve().parents[2]

HOLDER = """
import sys, time
from celery_semaphore import Semaphore
url, prefix, name, ttl = sys.argv[1:5]
sem = Semaphore(name, 2, redis=url, key_prefix=prefix, lease_ttl=60.0,
                liveness_ttl=float(ttl) or None)
permits = [sem.acquire(blocking=False) for _ in range(2)]
assert all(permits)
print("held", flush=True)
time.sleep(600)
"""


def _hold_in_child(url: str, prefix: str, name: str, ttl: float) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, url, prefix, name, str(ttl)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "held"
    return child


def _url(client: redis.Redis) -> str:
    kw = client.connection_pool.connection_kwargs
    return f"redis://{kw.get('host', '127.0.0.1')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"


def _seconds_until_granted(sem: Semaphore, bound: float) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < bound:
        if sem.acquire(blocking=False) is not None:
            return time.monotonic() - started
        time.sleep(0.02)
    return None


def test_a_killed_process_permits_come_back_when_its_record_expires(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    child = _hold_in_child(_url(redis_client), key_prefix, "dies", 0.5)
    sem = Semaphore("dies", 2, redis=redis_client, key_prefix=key_prefix, liveness_ttl=0.5)
    assert sem.acquire(blocking=False) is None  # both held by the child
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    took = [_seconds_until_granted(sem, 5.0), _seconds_until_granted(sem, 5.0)]
    assert None not in took, f"a dead process's permits were not reclaimed: {took}"
    assert max(t for t in took if t is not None) < 1.5  # the record's 0.5 s, not the 60 s lease
    assert int(redis_client.hget(sem.keys.state, "died") or 0) == 2
    # its record is gone from the prefix's one key: absent means dead
    assert redis_client.zscore(liveness.procs_key(key_prefix), "x") is None
    assert redis_client.zcard(liveness.procs_key(key_prefix)) == 1  # this process's own


def test_without_liveness_a_killed_process_keeps_its_permits_until_the_lease(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    child = _hold_in_child(_url(redis_client), key_prefix, "dies-off", 0)
    sem = Semaphore("dies-off", 2, redis=redis_client, key_prefix=key_prefix, liveness_ttl=0.5)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert _seconds_until_granted(sem, 1.5) is None  # the lease (60 s) holds them


def test_a_live_process_keeps_its_permit_beyond_many_liveness_ttls(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    sem = Semaphore("lives", 1, redis=redis_client, key_prefix=key_prefix, liveness_ttl=0.3)
    permit = sem.acquire(blocking=False)
    assert permit is not None
    other = Semaphore("lives", 1, redis=redis_client, key_prefix=key_prefix, liveness_ttl=0.3)
    assert _seconds_until_granted(other, 1.5) is None  # five TTLs: never reclaimed early
    assert permit.refresh() is True
    assert redis_client.hget(sem.keys.state, "died") is None
    assert permit.release() is True
    assert redis_client.hget(sem.keys.state, "live") is None  # nothing left behind


def test_an_unrefreshed_record_expires_and_its_holders_are_reclaimed(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """A record written with a short TTL and never refreshed (a process whose heartbeat
    stopped): its holder is reclaimed by the next acquire, on the server's clock."""
    sem = Semaphore("stale", 1, redis=redis_client, key_prefix=key_prefix, liveness_ttl=5.0)
    sem._load_scripts()
    sem._live_arg = "200 ghost/1/abc"  # another process's ident, a 0.2 s record
    permit = sem.acquire(blocking=False)
    assert permit is not None
    sem._live_arg = f"5000 {liveness.ident()}"
    assert sem.acquire(blocking=False) is None
    took = _seconds_until_granted(sem, 3.0)
    assert took is not None
    assert took < 1.0
    assert permit.refresh() is False
    assert permit.lost


def test_a_sweep_tells_a_dead_process_holders_from_expired_leases(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    sem = Semaphore("swept", 3, redis=redis_client, key_prefix=key_prefix, liveness_ttl=5.0)
    sem._load_scripts()
    sem._live_arg = "200 ghost/2/abc"
    dead = sem.acquire(blocking=False)
    sem._live_arg = f"5000 {liveness.ident()}"
    expiring = sem.try_acquire(sem.new_ticket(), lease_ttl=0.1).permit
    kept = sem.acquire(blocking=False)
    assert dead is not None
    assert expiring is not None
    assert kept is not None
    time.sleep(0.3)
    expired, died, _, _ = sem.sweep_by_reason()
    assert (expired, died) == (1, 1)
    assert [h.token for h in sem.holders()] == [kept.token]
    assert kept.release() is True


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_inspect_reports_each_holder_process_and_its_record_read_only(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """A holder of a live process, one whose process's record expired, one whose record is
    gone, one granted without liveness: inspect (even from an object without liveness) tells
    them apart, and reclaims nothing; the next acquire does, counted in died_total."""
    liveness.stop()  # no refresh of an earlier test's records sweeps the one expired below
    sem = Semaphore("seen", 4, redis=redis_client, key_prefix=key_prefix, liveness_ttl=30.0)
    plain = Semaphore("seen", 4, redis=redis_client, key_prefix=key_prefix)
    procs = liveness.procs_key(key_prefix)
    try:
        alive = sem.acquire(blocking=False)
        unlinked = plain.acquire(blocking=False)
        sem._live_arg = "60000 ghost/4/abc"
        dead = sem.acquire(blocking=False)
        assert alive is not None
        assert unlinked is not None
        assert dead is not None
        # fault injected: the ghost's record expired 1.5 s ago (its process stopped)
        redis_client.zadd(procs, {"ghost/4/abc": _server_ms(redis_client) - 1500}, xx=True)
        by_token = {h.token: h for h in plain.inspect().holders}
        mine = by_token[alive.token]
        assert (mine.process, mine.process_alive) == (liveness.ident(), True)
        assert mine.liveness_remaining is not None
        assert 25.0 < mine.liveness_remaining <= 30.0
        ghost = by_token[dead.token]
        assert (ghost.process, ghost.process_alive) == ("ghost/4/abc", False)
        assert ghost.liveness_remaining is not None
        assert -3.0 < ghost.liveness_remaining < -1.4
        lease_only = by_token[unlinked.token]
        assert (lease_only.process, lease_only.liveness_remaining) == (None, None)
        assert lease_only.process_alive is None
        # read-only: the expired record and its holder are still there
        assert redis_client.zscore(procs, "ghost/4/abc") is not None
        assert len(sem.inspect().holders) == 3
        redis_client.zrem(procs, "ghost/4/abc")  # removed by another process's refresh
        gone = next(h for h in sem.inspect().holders if h.token == dead.token)
        assert (gone.process_alive, gone.liveness_remaining) == (False, None)
        sem._live_arg = f"30000 {liveness.ident()}"
        assert sem.acquire(blocking=False) is not None  # reclaims the dead process's holder
        snap = plain.inspect()
        assert dead.token not in {h.token for h in snap.holders}
        assert (snap.died_total, snap.reclaimed_total) == (1, 1)
    finally:
        liveness.stop()
