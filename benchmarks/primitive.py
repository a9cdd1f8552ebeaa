"""Benchmark of the core primitive against the seed designs, in one run, as one table.

    python benchmarks/primitive.py [--redis-url URL] [--quick]

Redis: ``--redis-url`` as given, else :func:`celery_semaphore.ops.testing.redis_server` (the server
named by ``$CELERY_SEMAPHORE_TEST_REDIS_URL`` or ``redis://127.0.0.1:6379`` when reachable, else
a throwaway ``redis-server`` it starts and stops).  Every key lives under a fresh
``bench-<uuid>`` prefix and only those keys are deleted at the end (SCAN + DEL; never FLUSHDB).

What is measured:

* Uncontended, one connection: PING round trips per second on the very ``redis.Redis`` client
  the designs use, and acquire + release pairs per second for each design (non-blocking acquire,
  nothing else running).  Each is measured several times, interleaved, and the median is shown.
  ``PING-eq/pair`` = PING/s / pairs/s, the cost of one pair in PING round trips; ``vs PING/2``
  = pairs/s / (PING/s / 2), which is 1.0 for a design doing exactly one round trip per
  operation at the price of a PING.
* Floors (uncontended, not semaphores): pairs of two EVALSHA calls on redis-py's own path, doing
  less than ours: empty scripts, our prelude alone, and the Redis commands our uncontended
  acquire and release make without their logic.  With the Redis server time per pair of each
  (``INFO commandstats``) they split what a pair costs Redis: the script calls, the prelude,
  the commands, and our logic.
* Contended: PROCESSES processes share a semaphore of limit LIMIT for a fixed time; each loops
  acquire (blocking, bounded timeout) -> hold HOLD -> release.  Holders are counted by an
  independent counter in shared memory (not Redis): +1 right after acquire returns, -1 right
  before release, so any count above the limit is a real overlap of two grants.

The baselines are re-typed from the seed documents (Redis in Action 6.3.2 "fair semaphore",
its lock-protected variant, and the WATCH counting semaphore of seed 003), keeping their
round-trip structure, client clocks and retry delays; they are here only to be measured.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
import math
import multiprocessing
import os
import statistics
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib.resources import files
from multiprocessing import queues, synchronize
from queue import Empty
from typing import Any, Protocol

import redis
from redis.exceptions import WatchError

from celery_semaphore import Permit, Semaphore
from celery_semaphore.ops.testing import redis_server

# -- parameters ----------------------------------------------------------------------------------

PROCESSES = 12
LIMIT = 4
HOLD = 0.002  # seconds a permit is held in the contended test
SEED_RETRY = 0.001  # the blocking loop around the RiA fair semaphore (the book has none)
SEED_LOCK_WAIT = 0.01  # acquire_semaphore_with_lock: acquire_lock(..., acquire_timeout=0.01)
SEED_LOCK_TTL_MS = 10_000  # acquire_lock_with_timeout's default lock_timeout (10 s)
SEED_003_RETRY = 0.1  # seed 003's own retry_delay default
MAX_OPS = 5_000_000  # hard cap on any measuring loop, whatever the clock says
MAX_RETRIES = 100_000  # hard cap on any retry loop


@dataclass(frozen=True)
class Settings:
    repeats: int  # uncontended measurements per design (median reported)
    seconds: float  # length of one uncontended measurement
    duration: float  # contended run per design
    acquire_timeout: float  # bound on one blocking acquire in the contended run


FULL = Settings(repeats=5, seconds=1.0, duration=5.0, acquire_timeout=2.0)
QUICK = Settings(repeats=3, seconds=0.4, duration=2.0, acquire_timeout=1.0)


# -- the designs ---------------------------------------------------------------------------------


class Design(Protocol):
    """One semaphore implementation, bound to one Redis client and one semaphore name."""

    def try_acquire(self) -> object | None:
        """One non-blocking attempt: a handle, or None."""

    def acquire(self, timeout: float) -> object | None:
        """Block up to ``timeout`` seconds: a handle, or None."""

    def release(self, handle: object) -> None: ...


class Ours:
    """celery-semaphore: one Lua script per operation; blocked waiters are woken by release."""

    def __init__(self, client: redis.Redis, prefix: str, name: str, limit: int) -> None:
        self.sem = Semaphore(name, limit, redis=client, key_prefix=f"{prefix}:ours", lease_ttl=30)

    def try_acquire(self) -> object | None:
        return self.sem.acquire(blocking=False)

    def acquire(self, timeout: float) -> object | None:
        return self.sem.acquire(timeout=timeout)

    def release(self, handle: object) -> None:
        assert isinstance(handle, Permit)
        handle.release()


class SeedFair:
    """BASELINE, seeds 000/001: Redis in Action 6.3.2 ``acquire_fair_semaphore``.

    A timeout ZSET scored by the client's clock, an owner ZSET scored by a shared counter, and
    a rank check; two MULTI/EXEC round trips to acquire (three when refused), one to release.
    The book has no blocking acquire: here a caller retries every SEED_RETRY seconds.
    """

    def __init__(self, client: redis.Redis, prefix: str, name: str, limit: int) -> None:
        self.conn = client
        self.semname = f"{prefix}:seed-fair:{name}"
        self.owner = self.semname + ":owner"
        self.counter = self.semname + ":counter"
        self.limit = limit
        self.timeout = 10.0  # the book's default

    def try_acquire(self) -> object | None:
        identifier = str(uuid.uuid4())
        now = time.time()
        pipe = self.conn.pipeline(transaction=True)
        pipe.zremrangebyscore(self.semname, "-inf", now - self.timeout)
        pipe.zinterstore(self.owner, {self.owner: 1, self.semname: 0})
        pipe.incr(self.counter)
        counter = pipe.execute()[-1]
        pipe.zadd(self.semname, {identifier: now})
        pipe.zadd(self.owner, {identifier: counter})
        pipe.zrank(self.owner, identifier)
        if pipe.execute()[-1] < self.limit:
            return identifier
        pipe.zrem(self.semname, identifier)
        pipe.zrem(self.owner, identifier)
        pipe.execute()
        return None

    def acquire(self, timeout: float) -> object | None:
        return _retry(self.try_acquire, timeout, SEED_RETRY)

    def release(self, handle: object) -> None:
        pipe = self.conn.pipeline(transaction=True)
        pipe.zrem(self.semname, str(handle))
        pipe.zrem(self.owner, str(handle))
        pipe.execute()


_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class SeedFairLocked(SeedFair):
    """BASELINE, seed 000 ("the book's fix"): ``acquire_semaphore_with_lock``.

    The fair acquire runs under a short Redis lock (SET NX PX, retried every 1 ms for up to
    10 ms, as the book's ``acquire_lock``).  The lock is released by a one-round-trip
    compare-and-delete script, cheaper than the book's WATCH/GET/MULTI release.
    """

    def __init__(self, client: redis.Redis, prefix: str, name: str, limit: int) -> None:
        super().__init__(client, prefix, name, limit)
        self.semname = f"{prefix}:seed-fair-lock:{name}"
        self.owner = self.semname + ":owner"
        self.counter = self.semname + ":counter"
        self.lockname = self.semname + ":lock"
        self.unlock = client.register_script(_UNLOCK)

    def try_acquire(self) -> object | None:
        identifier = str(uuid.uuid4())
        end = time.monotonic() + SEED_LOCK_WAIT
        for _ in range(MAX_RETRIES):
            if self.conn.set(self.lockname, identifier, nx=True, px=SEED_LOCK_TTL_MS):
                try:
                    return super().try_acquire()
                finally:
                    self.unlock(keys=[self.lockname], args=[identifier])
            if time.monotonic() >= end:
                break
            time.sleep(0.001)
        return None


class SeedWatch:
    """BASELINE, seed 003: ``DistributedSemaphore``, a ZSET of expiry times (client clock).

    Per attempt: ZREMRANGEBYSCORE, WATCH, ZCARD, then MULTI/ZADD/EXEC; a WatchError retries at
    once, a full semaphore sleeps the seed's ``retry_delay`` (0.1 s).  Release is one ZREM.
    Re-typed with the pipeline reset after each attempt (the seed leaves a WATCHing pipeline
    behind) and a deadline (the seed waits forever).
    """

    def __init__(self, client: redis.Redis, prefix: str, name: str, limit: int) -> None:
        self.conn = client
        self.key = f"{prefix}:seed-watch:{name}"
        self.limit = limit
        self.timeout = 30.0  # the seed's default permit lifetime

    def _acquire(self, blocking: bool, wait: float) -> str | None:
        permit_id = str(uuid.uuid4())
        expires_at = time.time() + self.timeout
        deadline = time.monotonic() + wait
        for _ in range(MAX_RETRIES):
            self.conn.zremrangebyscore(self.key, "-inf", time.time())
            with self.conn.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(self.key)  # type: ignore[no-untyped-call]  # untyped in redis-py
                    if pipe.zcard(self.key) < self.limit:
                        pipe.multi()
                        pipe.zadd(self.key, {permit_id: expires_at})
                        pipe.execute()
                        return permit_id
                    pipe.unwatch()
                except WatchError:
                    if time.monotonic() < deadline:
                        continue
                    return None
            remaining = deadline - time.monotonic()
            if not blocking or remaining <= 0:
                return None
            time.sleep(min(SEED_003_RETRY, remaining))
        return None

    def try_acquire(self) -> object | None:
        return self._acquire(False, 0.0)

    def acquire(self, timeout: float) -> object | None:
        return self._acquire(True, timeout)

    def release(self, handle: object) -> None:
        self.conn.zrem(self.key, str(handle))


def _retry(attempt: Callable[[], object | None], timeout: float, delay: float) -> object | None:
    deadline = time.monotonic() + timeout
    for _ in range(MAX_RETRIES):
        handle = attempt()
        if handle is not None:
            return handle
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        time.sleep(min(delay, remaining))
    return None


# -- floors: what one round trip per operation costs before any semaphore logic -----------------
#
# Not semaphores: uncontended pairs of two scripts that do less than ours, sent through redis-py's
# own EVALSHA path (the one PING takes), to split a pair's cost into the script call itself, the
# shared prelude, the Redis commands an uncontended acquire and release make, and the rest.

# The commands of our uncontended acquire (ARGV[2] == 'a') and release, as MONITOR shows them, on
# the same key layout and with fields of the same size; no decisions, no parsing.
_DATA_ONLY = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local h = 'h:' .. ARGV[1]
redis.call('ZCOUNT', KEYS[1], '-inf', now)
if ARGV[2] == 'a' then
  redis.call('HMGET', KEYS[2], 'used', 'limit_override', 'pused', 'p:', 'rate', 'aimd', h,
    'w:' .. ARGV[1], 'fence', 'p:')
  redis.call('ZCARD', KEYS[3])
  redis.call('ZADD', KEYS[1], 'NX', now + 30000, h)
  redis.call('HSET', KEYS[2], 'used', 1, 'fence', 6, h, '1 6 ' .. now .. ' 0 0 0 ' .. ARGV[3])
  return {1, 6, now + 30000, now, 4, 0}
end
redis.call('HMGET', KEYS[2], 'used', 'limit_override', 'pused', 'p:', 'rate', 'aimd', h,
  'hold_avg', 'fence')
redis.call('ZCARD', KEYS[3])
redis.call('HSET', KEYS[2], 'used', 0, 'hold_avg', 1)
redis.call('HDEL', KEYS[2], h)
redis.call('ZADD', KEYS[1], now + 10000, h)
return {1}
"""


def _lib_prelude() -> str:
    # the prelude every one of our scripts starts with (celery_semaphore/core/scripts/_lib.lua)
    return (files("celery_semaphore.core") / "scripts" / "_lib.lua").read_text("utf-8")


FLOORS: dict[str, str] = {
    "empty": "FLOOR two empty scripts (return 1)",
    "prelude": "FLOOR two scripts: our prelude, then return 1",
    "data": "FLOOR two scripts: our pair's Redis commands only",
}


def _floor_steps(client: redis.Redis, prefix: str) -> dict[str, Callable[[], None]]:
    """One uncontended "pair" per floor: two EVALSHA calls, replies not looked at."""
    keys = [f"{prefix}:{{floor}}:{part}" for part in ("expiry", "state", "line", "starts")]
    ticket = uuid.uuid4().hex
    owner = json.dumps({"host": os.uname().nodename, "pid": os.getpid()})
    empty = client.script_load("return 1")
    prelude = client.script_load(_lib_prelude() + "\nreturn 1")
    data = client.script_load(_DATA_ONLY)

    def two_empty() -> None:
        client.evalsha(empty, 0)
        client.evalsha(empty, 0)

    def two_prelude() -> None:
        client.evalsha(prelude, 4, *keys, "0")
        client.evalsha(prelude, 4, *keys, "0")

    def two_data() -> None:
        client.evalsha(data, 4, *keys, ticket, "a", owner)
        client.evalsha(data, 4, *keys, ticket, "r", owner)

    return {"empty": two_empty, "prelude": two_prelude, "data": two_data}


Factory = Callable[[redis.Redis, str, str, int], Design]

DESIGNS: dict[str, tuple[str, Factory]] = {
    "ours": ("celery-semaphore (ours), wake-ups", Ours),
    "fair": ("BASELINE seed 000/001 fair (RiA 6.3.2), 1 ms retry", SeedFair),
    "fair_lock": ("BASELINE seed 000/001 fair + acquire lock, 1 ms retry", SeedFairLocked),
    "watch": ("BASELINE seed 003 WATCH, seed's 100 ms retry", SeedWatch),
}


# -- statistics ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def jain(counts: Sequence[int]) -> float:
    """Jain's fairness index: 1.0 when every process got the same number of grants."""
    total, squares = sum(counts), sum(c * c for c in counts)
    return (total * total) / (len(counts) * squares) if squares else math.nan


# -- uncontended ---------------------------------------------------------------------------------


def _rate(step: Callable[[], None], seconds: float) -> float:
    """Operations per second of ``step`` run back to back for about ``seconds``."""
    n = 0
    started = time.perf_counter()
    end = started + seconds
    while n < MAX_OPS:
        step()
        n += 1
        if time.perf_counter() >= end:
            break
    return n / (time.perf_counter() - started)


def _pair(design: Design) -> Callable[[], None]:
    def step() -> None:
        handle = design.try_acquire()
        if handle is None:
            raise RuntimeError(f"{type(design).__name__}: uncontended acquire was refused")
        design.release(handle)

    return step


def measure_uncontended(
    url: str, prefix: str, settings: Settings
) -> tuple[float, dict[str, float]]:
    """Median PING/s and median pairs/s per design, all on one redis.Redis client."""
    client = redis.Redis.from_url(url)
    try:
        designs = {
            key: make(client, prefix, f"uncontended-{key}", LIMIT)
            for key, (_, make) in DESIGNS.items()
        }

        def ping() -> None:
            client.ping()

        steps: dict[str, Callable[[], None]] = {"ping": ping}
        for key, design in designs.items():
            steps[key] = _pair(design)
        steps.update(_floor_steps(client, prefix))
        for step in steps.values():  # warm up: connection, script loading
            _rate(step, 0.05)
        samples: dict[str, list[float]] = {key: [] for key in steps}
        for _ in range(settings.repeats):  # interleaved, so drift hits every design alike
            for key, step in steps.items():
                samples[key].append(_rate(step, settings.seconds))
        medians = {key: statistics.median(values) for key, values in samples.items()}
        return medians.pop("ping"), medians
    finally:
        client.close()


def server_time(url: str, prefix: str, pairs: int = 400, rounds: int = 5) -> dict[str, float]:
    """Redis server time per uncontended pair, in microseconds: the EVALSHA (PING for "ping")
    time ``INFO commandstats`` adds while ``pairs`` pairs run; the median of ``rounds`` rounds,
    interleaved (one round alone swings by a third on a busy machine).  Scripts count their
    commands in it.  Read as deltas, so it assumes nobody else runs scripts on that server
    meanwhile."""
    client = redis.Redis.from_url(url)
    try:

        def two_pings() -> None:
            client.ping()
            client.ping()

        steps: dict[str, Callable[[], None]] = {"ping": two_pings}
        steps.update(_floor_steps(client, prefix))
        steps["ours"] = _pair(Ours(client, prefix, "server-time", LIMIT))
        samples: dict[str, list[float]] = {key: [] for key in steps}
        for step in steps.values():
            step()  # load scripts
        for _ in range(rounds):
            for key, step in steps.items():
                command = "cmdstat_ping" if key == "ping" else "cmdstat_evalsha"
                before = client.info("commandstats").get(command, {}).get("usec", 0)
                for _ in range(pairs):
                    step()
                after = client.info("commandstats").get(command, {}).get("usec", 0)
                samples[key].append((after - before) / pairs)
        return {key: statistics.median(values) for key, values in samples.items()}
    finally:
        client.close()


def count_round_trips(url: str, prefix: str, pairs: int = 200) -> dict[str, float]:
    """Round trips per uncontended pair, counted, not timed: every write to the socket of a
    separate client (one per command, one per pipeline) is counted."""
    client = redis.Redis.from_url(url)
    sends = [0]
    pool = client.connection_pool
    base: Any = pool.connection_class

    def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
        sends[0] += 1
        base.send_packed_command(self, command, check_health)

    pool.connection_class = type("Counting", (base,), {"send_packed_command": send_packed_command})
    try:
        client.ping()  # connect (the handshake is not counted below)
        steps = {
            key: _pair(make(client, prefix, f"count-{key}", LIMIT))
            for key, (_, make) in DESIGNS.items()
        }
        steps.update(_floor_steps(client, prefix))
        out: dict[str, float] = {}
        for key, step in steps.items():
            step()  # load scripts
            sends[0] = 0
            for _ in range(pairs):
                step()
            out[key] = sends[0] / pairs
        return out
    finally:
        client.close()


# -- contended -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerSpec:
    design: str
    url: str
    prefix: str
    name: str
    limit: int
    hold: float
    duration: float
    acquire_timeout: float


@dataclass(frozen=True)
class WorkerResult:
    index: int
    grants: int  # grants whose acquire returned within the measured window
    timeouts: int  # acquires that returned nothing within acquire_timeout
    waits_ms: list[float]  # every acquire started in the window, granted or timed out
    started: float  # monotonic
    stopped: float  # monotonic: the end of the window
    error: str = ""


@dataclass(frozen=True)
class ContendedResult:
    grants_per_s: float
    max_holders: int
    over_limit: int
    jain: float
    p50_ms: float
    p99_ms: float
    timeouts: int
    errors: list[str]


def _worker(
    index: int,
    spec: WorkerSpec,
    counters: Any,  # shared int array: [inside now, most inside seen, over-limit events]
    lock: synchronize.Lock,
    barrier: synchronize.Barrier,
    results: queues.Queue[WorkerResult],
) -> None:
    grants = timeouts = 0
    waits: list[float] = []
    started = stopped = time.monotonic()
    try:
        client = redis.Redis.from_url(spec.url)
        design = DESIGNS[spec.design][1](client, spec.prefix, spec.name, spec.limit)
        client.ping()
        barrier.wait(timeout=60)
        started = time.monotonic()
        stopped = started + spec.duration
        for _ in range(MAX_OPS):
            t0 = time.monotonic()
            if t0 >= stopped:
                break
            handle = design.acquire(spec.acquire_timeout)
            t1 = time.monotonic()
            waits.append((t1 - t0) * 1000)
            if handle is None:
                timeouts += 1
                continue
            if t1 < stopped:
                grants += 1
            with lock:
                counters[0] += 1
                inside = counters[0]
                if inside > counters[1]:
                    counters[1] = inside
                if inside > spec.limit:
                    counters[2] += 1
            try:
                time.sleep(spec.hold)
            finally:
                with lock:
                    counters[0] -= 1
                design.release(handle)
        client.close()
        results.put(WorkerResult(index, grants, timeouts, waits, started, stopped))
    except BaseException:
        results.put(
            WorkerResult(
                index, grants, timeouts, waits, started, stopped, traceback.format_exc(limit=3)
            )
        )


def _context() -> multiprocessing.context.ForkContext | multiprocessing.context.SpawnContext:
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods:  # fast, and the workers build their own clients
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def run_contended(design: str, url: str, prefix: str, settings: Settings) -> ContendedResult:
    ctx = _context()
    spec = WorkerSpec(
        design=design,
        url=url,
        prefix=prefix,
        name=f"contended-{design}",
        limit=LIMIT,
        hold=HOLD,
        duration=settings.duration,
        acquire_timeout=settings.acquire_timeout,
    )
    counters = ctx.RawArray(ctypes.c_long, 3)
    lock = ctx.Lock()
    barrier = ctx.Barrier(PROCESSES)
    results: queues.Queue[WorkerResult] = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(i, spec, counters, lock, barrier, results), daemon=True)
        for i in range(PROCESSES)
    ]
    collected: list[WorkerResult] = []
    errors: list[str] = []
    try:
        for p in procs:
            p.start()
        budget = time.monotonic() + 90 + settings.duration + 2 * settings.acquire_timeout
        while len(collected) < PROCESSES:
            left = budget - time.monotonic()
            if left <= 0:
                errors.append(f"only {len(collected)} of {PROCESSES} workers reported in time")
                break
            try:
                collected.append(results.get(timeout=min(left, 5.0)))
            except Empty:
                if not any(p.is_alive() for p in procs) and results.empty():
                    errors.append(f"workers exited; {len(collected)} of {PROCESSES} reported")
                    break
    finally:
        for p in procs:
            p.join(timeout=10)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        results.close()
    errors += [f"worker {r.index}: {r.error.strip()}" for r in collected if r.error]
    waits = [w for r in collected for w in r.waits_ms]
    span = (
        max(r.stopped for r in collected) - min(r.started for r in collected) if collected else 0.0
    )
    grants = [r.grants for r in collected] + [0] * (PROCESSES - len(collected))
    return ContendedResult(
        grants_per_s=sum(grants) / span if span > 0 else math.nan,
        max_holders=int(counters[1]),
        over_limit=int(counters[2]),
        jain=jain(grants),
        p50_ms=percentile(waits, 50),
        p99_ms=percentile(waits, 99),
        timeouts=sum(r.timeouts for r in collected),
        errors=errors,
    )


# -- output --------------------------------------------------------------------------------------


def render(groups: list[tuple[str, int]], header: list[str], rows: list[list[str]]) -> str:
    """Plain-text table: a row of column groups, the header, a rule, the rows; the first column
    left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    spans: list[str] = []
    col = 0
    for title, n in groups:  # widen the last column of a group until its title fits
        need = len(title) - (sum(widths[col : col + n]) + 2 * (n - 1))
        if need > 0:
            widths[col + n - 1] += need
        width = sum(widths[col : col + n]) + 2 * (n - 1)
        spans.append(title.center(width, "-") if title else " " * width)
        col += n

    def line(cells: list[str]) -> str:
        out = [cells[0].ljust(widths[0])]
        out += [cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join(["  ".join(spans).rstrip(), line(header), rule, *(line(r) for r in rows)])


def _num(value: float, digits: int = 0) -> str:
    return "n/a" if math.isnan(value) else f"{value:,.{digits}f}"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# -- Redis target and cleanup -------------------------------------------------------------------


@contextlib.contextmanager
def redis_target(url: str | None) -> Iterator[tuple[str, str]]:
    """(url, how it was found).  An explicit URL must answer; nothing is started for it."""
    if url:
        probe = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)
        try:
            probe.ping()
        except redis.RedisError as exc:
            raise SystemExit(f"--redis-url {url}: not reachable: {exc}") from exc
        finally:
            probe.close()
        yield url, "given by --redis-url"
        return
    with redis_server() as server:
        yield server.url(db=0), "throwaway server started" if server.owned else "reused"


def cleanup(url: str, prefix: str) -> tuple[int, int]:
    """Delete the keys under ``prefix`` (SCAN + DEL, nothing else).  (deleted, left)."""
    client = redis.Redis.from_url(url)
    try:
        deleted = 0
        for _ in range(10):  # a few passes, in case a key was written during a scan
            keys = list(itertools.islice(client.scan_iter(match=f"{prefix}:*", count=1000), 10**6))
            if not keys:
                break
            for i in range(0, len(keys), 500):
                deleted += int(client.delete(*keys[i : i + 500]))
        left = sum(1 for _ in client.scan_iter(match=f"{prefix}:*", count=1000))
        return deleted, left
    finally:
        client.close()


# -- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--redis-url", help="Redis to use (default: reuse or start one)")
    parser.add_argument("--quick", action="store_true", help="shorter runs (about 15 s)")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    t_start = time.monotonic()
    prefix = f"bench-{uuid.uuid4().hex}"

    with redis_target(args.redis_url) as (url, origin):
        info = redis.Redis.from_url(url)
        try:
            version = str(info.info("server").get("redis_version", "?"))
        finally:
            info.close()
        try:
            ping_s, pairs = measure_uncontended(url, prefix, settings)
            trips = count_round_trips(url, prefix)
            server_us = server_time(url, prefix)
            contended = {key: run_contended(key, url, prefix, settings) for key in DESIGNS}
        finally:
            deleted, left = cleanup(url, prefix)
    elapsed = time.monotonic() - t_start

    groups = [
        ("", 1),
        (" uncontended, one connection ", 5),
        (f" contended: {PROCESSES} processes, limit {LIMIT}, {HOLD * 1000:g} ms holds ", 7),
    ]
    header = [
        "design",
        "pairs/s",
        "trips",
        "PING-eq",
        "vs PING/2",
        "server us",
        "grants/s",
        "max held",
        "over-limit",
        "Jain",
        "p50 ms",
        "p99 ms",
        "timeouts",
    ]
    rows = [
        ["redis PING on the same connection (round trips/s)", _num(ping_s), "", "", ""]
        + [_num(server_us["ping"], 1)]  # two PINGs' server time
        + [""] * 7
    ]

    def uncontended(key: str) -> list[str]:
        return [
            _num(pairs[key]),
            _num(trips[key], 1),
            _num(ping_s / pairs[key], 2),
            _num(pairs[key] / (ping_s / 2), 2),
            _num(server_us[key], 1) if key in server_us else "",
        ]

    for key, label in FLOORS.items():
        rows.append([label, *uncontended(key)] + [""] * 7)
    for key, (label, _) in DESIGNS.items():
        c = contended[key]
        rows.append(
            [
                label,
                *uncontended(key),
                _num(c.grants_per_s),
                str(c.max_holders),
                str(c.over_limit),
                _num(c.jain, 3),
                _num(c.p50_ms, 2),
                _num(c.p99_ms, 2),
                str(c.timeouts),
            ]
        )

    mode = "quick" if args.quick else "full"
    print(
        f"celery-semaphore primitive benchmark ({mode}): Redis {version} at {url} ({origin}); "
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
    )
    print(
        f"uncontended: median of {settings.repeats} x {settings.seconds:g} s, interleaved; "
        f"contended: {PROCESSES} processes, limit {LIMIT}, hold {HOLD * 1000:g} ms, "
        f"{settings.duration:g} s per design, acquire timeout {settings.acquire_timeout:g} s"
    )
    print()
    print(render(groups, header, rows))
    print()
    for note in (
        "pairs/s: acquire(blocking=False) + release pairs/s; trips: round trips per pair, "
        "counted on the socket;",
        "PING-eq = PING/s / pairs/s (a pair's cost in PINGs); vs PING/2 = pairs/s / (PING/s / 2).",
        "server us: Redis server time per pair (INFO commandstats, EVALSHA; two PINGs on the "
        "PING row), median of 5 rounds of 400 pairs.",
        "max held, over-limit: a shared-memory counter, not Redis (+1 after acquire returns, "
        "-1 before release).",
        "p50/p99: wait in acquire, over every acquire started in the window (timed-out ones at "
        "the time they gave up);",
        "grants/s and Jain (over grants per process) count grants made within the window.",
        "FLOOR rows are not semaphores: two EVALSHA calls per pair on redis-py's own path (as "
        "PING), doing less than ours;",
        "'our pair's Redis commands only' makes the commands an uncontended acquire and release "
        "of ours make, without their logic or the prelude.",
    ):
        print(note)
    for key, (label, _) in DESIGNS.items():
        for err in contended[key].errors:
            print(f"ERROR {label}: {err}")

    ours = contended["ours"]
    ratio = pairs["ours"] / (ping_s / 2)
    seeds = {key: c for key, c in contended.items() if key != "ours"}
    best_key = min(seeds, key=lambda k: seeds[k].p99_ms)
    best = seeds[best_key]
    within = {k: c for k, c in seeds.items() if c.over_limit == 0}
    print()
    print("targets (computed from the numbers above):")
    print(
        f"  {_verdict(ratio >= 0.9)}  uncontended pairs/s / (PING/s / 2) >= 0.90 "
        f"(one round trip per operation): {ratio:.2f}"
    )
    print(
        f"  {_verdict(trips['ours'] <= 2.0)}  ours round trips per acquire+release pair <= 2 "
        f"(counted on the socket): {trips['ours']:.1f}"
    )
    print(
        f"  {_verdict(ours.max_holders <= LIMIT)}  ours max holders <= {LIMIT}: {ours.max_holders}"
    )
    print(f"  {_verdict(ours.over_limit == 0)}  ours over-limit events == 0: {ours.over_limit}")
    print(
        f"  {_verdict(ours.p99_ms < best.p99_ms)}  ours p99 wait < best seed p99 "
        f"({DESIGNS[best_key][0]}: {_num(best.p99_ms, 2)} ms): "
        f"{_num(ours.p99_ms, 2)} ms"
    )
    data_ratio = pairs["data"] / (ping_s / 2)
    print(
        f"  {_verdict(ratio >= 0.8)}  uncontended pairs/s / (PING/s / 2) >= 0.80 (issue 18): "
        f"{ratio:.2f}; the floor of our pair's Redis commands alone: {data_ratio:.2f}"
    )
    budget = (2 / (0.8 * ping_s) - 2 / ping_s) * 1e6
    print(
        f"  info  0.80 leaves a pair {budget:.0f} us of wall time above two PINGs "
        f"(ours: {(1 / pairs['ours'] - 2 / ping_s) * 1e6:.0f} us).  Redis server time per "
        f"pair, above two PINGs: ours {server_us['ours'] - server_us['ping']:.0f} us; "
        f"two empty scripts {server_us['empty'] - server_us['ping']:.0f} us, with our "
        f"prelude {server_us['prelude'] - server_us['ping']:.0f} us, our pair's commands "
        f"alone {server_us['data'] - server_us['ping']:.0f} us"
    )
    if within:
        best_safe = min(within, key=lambda k: within[k].p99_ms)
        print(
            f"  info  best seed p99 among seeds that stayed within the limit: "
            f"{_num(within[best_safe].p99_ms, 2)} ms ({DESIGNS[best_safe][0]})"
        )
    flaw = contended["fair"]
    print(
        f"  info  seed fair semaphore over the limit: max {flaw.max_holders} holders, "
        f"{flaw.over_limit} over-limit events ("
        + ("flaw reproduced" if flaw.max_holders > LIMIT else "flaw not seen in this run")
        + ")"
    )
    failed = any(c.errors for c in contended.values())
    print(
        f"cleanup: deleted {deleted} keys under {prefix}, {left} left; "
        f"run time {elapsed:.1f} s" + ("; WORKER ERRORS above" if failed else "")
    )
    return 1 if failed or left else 0


if __name__ == "__main__":
    sys.exit(main())
