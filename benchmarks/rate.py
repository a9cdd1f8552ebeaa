"""Rate benchmark: starts per second against the configured rate, on real Celery workers.

    python benchmarks/rate.py [--quick] [--redis-url URL] [--broker-url URL] [--repeats N]
                              [--pool prefork|threads|both] [--tasks N] [--cases 0abc]
                              [--keep-logs]

Two worker nodes (``celery -A benchmarks.rate_app worker``, prefork ``-c 4`` by default, each
in its own process group, ready when it answers ``control.ping``) serve every case of one pool,
in one run of this script, cases interleaved and repeated (default 3 times; the table quotes
medians).  About 3 minutes by default (``--quick``: 80 tasks, 1 repeat, about 20 s).

Celery's own ``rate_limit`` (case b), Celery/kombu 5.7.0: the two nodes start about 40 tasks
per second for the first ~70, then about one per second per node.  Measured with the Redis
broker also with a bare Celery app, no celery-semaphore loaded (156 of 200 started in 45 s on 2
prefork nodes; 40 tasks took 38 s on one threads node), and the same here on RabbitMQ
(``--broker-url amqp://...``: 108 of 200 in 20 s); celery#5927 reports the like.  On the
threads pool it crawls from the start (44 of 200 in 20 s on the 2 nodes).  Such a run stops at
its time bound; the table says how many had started, and its windows count them.

* (0) ``rate.plain``: no limit at all: how fast these nodes start the tasks unhindered (the
  ceiling every other row stays under);
* (a) ``@limited("bench-rate", limit=64, rate="20/s")``: one rate for the cluster;
* (b) Celery's own ``rate_limit="20/s"`` on the same 2 nodes: a rate per worker, so the
  cluster admits about twice it (the baseline);
* (c) ``@limited("bench-rate-both", limit=2, rate="20/s")`` with 200 ms bodies: the units are
  the constraint (2 units / 0.2 s = 10 starts/s), the rate must hold as well;
* (d) adaptive limits: a fake service that serves 20 calls at once and refuses (429) the rest;
  the same calls under a fixed limit of 40 and with ``adaptive=True`` (each refusal reports
  ``throttled(retry_after=0.1)``), on 2 threads nodes of 24 threads; the 429s of each, in a
  table of its own.

Each case sends all its tasks at once (one producer) and waits for every body to record
itself.  The starts are the bodies' own ``time.time()`` at entry (see
``benchmarks/rate_app.py``), independent of the semaphore and of Celery.  Per run:

* max / 1 s: the most starts in any window of one second (every window, sliding);
* mean / 1 s: the mean number of starts in a window of one second, over the windows that lie
  between the first and the last start (the backlog lasted all that time: every task was
  sent at once), sampled every 10 ms;
* over: the share of those windows holding more starts than the cluster's configured rate;
* total: from the first send to the last body end; tasks/s: tasks / total.

Redis: ``--redis-url`` as given, else :func:`celery_semaphore.ops.testing.redis_server` (the
server named by ``$CELERY_SEMAPHORE_TEST_REDIS_URL`` or ``redis://127.0.0.1:6379`` when
reachable, else a throwaway ``redis-server``).  The broker is that Redis unless
``--broker-url`` names another.  Every key lives under a fresh ``bench-rate-<uuid>`` prefix
(kombu's too) and only those keys, and the run's queue, are deleted at the end (SCAN + DEL,
never FLUSHDB).  Every wait is bounded in time; only the worker process groups this script
started are signalled.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import rate_app  # benchmarks/rate_app.py: this script's directory is sys.path[0]
import redis
from e2e import Worker, cleanup, host_busy, host_jiffies, library_version, redis_target

from celery_semaphore import Semaphore

ROOT = Path(__file__).resolve().parents[1]
NODES = 2
SLOTS = {"prefork": 4, "threads": 8}  # per node
#: threads per node in the adaptive case: more slots than the limit (2 x 24 > 40)
ADAPTIVE_SLOTS = 24
START_TIMEOUT = 60.0
#: the cluster's configured rate, starts per second (rate_app.RATE)
CONFIGURED = float(rate_app.RATE_PER_SECOND)
#: seconds between two runs on the same nodes: longer than any window, so no run inherits
#: the previous one's starts (or Celery's token bucket)
GAP = 1.5


@dataclass(frozen=True)
class Case:
    key: str
    label: str
    task: str
    n: int
    d: float  # body, seconds
    limit: str  # the concurrency, as shown
    admits: float  # starts/s the cluster is expected to admit by design (NaN: no bound)
    configured: float  # the cluster's configured rate (NaN: none)
    semaphore: str = ""  # the semaphore's name, for @limited cases

    @property
    def kind(self) -> str:
        return rate_app.KINDS[self.task]

    def tasks(self) -> str:
        return f"{self.n} x {self.d * 1000:g} ms"

    def bound(self) -> float:
        """Seconds a run may take: twice its expected length, and 10 s more."""
        expected = self.n / self.admits if not math.isnan(self.admits) else 1.0
        return 10.0 + 2.0 * expected


def cases(n: int) -> list[Case]:
    both_n = max(10, n // 4)
    units_rate = rate_app.BOTH_LIMIT / 0.2
    return [
        Case("0", "(0) no limit", rate_app.PLAIN, n, 0.02, "-", math.nan, math.nan),
        Case(
            "a",
            f'(a) @limited(limit={rate_app.HIGH_LIMIT}, rate="{rate_app.RATE}")',
            rate_app.LIMITED,
            n,
            0.02,
            str(rate_app.HIGH_LIMIT),
            CONFIGURED,
            CONFIGURED,
            rate_app.LIMITED_NAME,
        ),
        Case(
            "b",
            f'(b) Celery rate_limit="{rate_app.RATE}" (per worker)',
            rate_app.CELERY,
            n,
            0.02,
            "-",
            NODES * CONFIGURED,
            CONFIGURED,
        ),
        Case(
            "c",
            f'(c) @limited(limit={rate_app.BOTH_LIMIT}, rate="{rate_app.RATE}")',
            rate_app.BOTH,
            both_n,
            0.2,
            str(rate_app.BOTH_LIMIT),
            min(units_rate, CONFIGURED),
            CONFIGURED,
            rate_app.BOTH_NAME,
        ),
    ]


# -- workers --------------------------------------------------------------------------------


def stop_worker(worker: Worker, timeout: float = 15.0) -> None:
    """SIGTERM to the node's main process only (a warm shutdown: its pool children are its
    to stop, so they are not reported as lost), then SIGKILL to its whole process group, which
    this script created (``start_new_session``); nothing else is signalled."""
    if worker.process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            worker.process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.process.wait(timeout=timeout)
    worker.stop(timeout=5)  # e2e's: SIGTERM, then SIGKILL, to the group; a no-op when all gone


def start_workers(
    cfg: rate_app.AppConfig, client: Any, pool: str, logdir: Path, slots: int | None = None
) -> list[Worker]:
    env = dict(os.environ)
    env.update(cfg.environ())
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    started: list[Worker] = []
    logdir.mkdir(parents=True, exist_ok=True)
    try:
        for i in range(NODES):
            node = f"rate{i}-{uuid.uuid4().hex[:6]}@localhost"
            logfile = logdir / f"{node.split('@')[0]}.log"
            args = [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "benchmarks.rate_app",
                "worker",
                "-P",
                pool,
                "-c",
                str(slots or SLOTS[pool]),
                "-n",
                node,
                "-Q",
                cfg.queue,
                "--without-gossip",
                "--without-mingle",
                "-l",
                "WARNING",
                "--logfile",
                str(logfile),
            ]
            proc = subprocess.Popen(
                args,
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped by Worker.stop
            )
            started.append(Worker(node, proc, logfile))
        for worker in started:
            deadline = time.monotonic() + START_TIMEOUT
            while not client.control.ping(destination=[worker.node], timeout=0.5):
                if worker.process.poll() is not None:
                    raise RuntimeError(f"worker {worker.node} exited:\n{worker.log()[-3000:]}")
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"worker {worker.node} not ready in {START_TIMEOUT}s")
    except BaseException:
        for worker in started:
            stop_worker(worker, timeout=5)
        raise
    return started


# -- one run --------------------------------------------------------------------------------


@dataclass
class Run:
    case: Case
    first_send: float
    starts: list[float]  # epoch seconds, sorted
    ends: list[float]
    max_inside: int
    host: float  # share of the host's CPU time in use during the run
    grants: list[float]  # the semaphore's own record of its grants (server clock), sorted
    split: list[int]  # bodies per node, the busiest first

    @property
    def complete(self) -> bool:
        return len(self.starts) >= self.case.n

    @property
    def total(self) -> float:
        return max(self.ends) - self.first_send if self.complete else math.nan

    @property
    def throughput(self) -> float:
        return self.case.n / self.total if self.complete else math.nan


def _send(client: Any, task: str, n: int, d: float) -> float:
    first = time.time()
    with client.producer_or_acquire() as producer:
        for _ in range(n):
            client.send_task(task, args=(d,), producer=producer)
    return first


def _wait_ledger(
    r: redis.Redis,
    key: str,
    n: int,
    timeout: float,
    each: Callable[[], None] | None = None,
) -> bool:
    """Wait until the ledger ``key`` holds ``n`` bodies (False after ``timeout`` seconds);
    ``each`` is called every 0.1 s or so meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        if each is not None:
            each()
        if int(r.llen(key)) >= n:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _reset(r: redis.Redis, cfg: rate_app.AppConfig) -> None:
    for pattern in ("ledger:*", "max:*", "inside:*"):
        for key in list(r.scan_iter(match=cfg.key(pattern))):
            r.delete(key)


def warm_up(client: Any, r: redis.Redis, cfg: rate_app.AppConfig, pool: str) -> None:
    """Pool children/threads, connections, scripts, Celery's buckets; then forget it all."""
    n = 2 * NODES * SLOTS[pool]
    # Celery's rate_limit crawls on the threads pool (see the module's docstring): one task
    # per node is enough to load its code path
    few = {rate_app.PLAIN: n, rate_app.LIMITED: 4, rate_app.CELERY: NODES, rate_app.BOTH: 4}
    for task, count in few.items():
        _send(client, task, count, 0.005 if task == rate_app.PLAIN else 0.001)
    for task, want in few.items():
        kind = rate_app.KINDS[task]
        if not _wait_ledger(r, cfg.key("ledger", kind), want, 60.0):
            raise RuntimeError(f"warm-up: {kind} did not finish in 60 s")
    time.sleep(GAP)
    _reset(r, cfg)


def starts_key(r: redis.Redis, cfg: rate_app.AppConfig, name: str) -> str:
    """The semaphore's own log of starts (one member per grant, scored by the server's ms;
    trimmed to the last window at each start)."""
    return Semaphore(name, 1, redis=r, key_prefix=cfg.key("sem")).keys.starts


def run_case(case: Case, client: Any, r: redis.Redis, cfg: rate_app.AppConfig) -> Run:
    _reset(r, cfg)
    grants: dict[str, float] = {}
    log_key = starts_key(r, cfg, case.semaphore) if case.semaphore else ""
    secs, micros = r.time()
    since_ms = float(secs) * 1000 + float(micros) / 1000  # server clock, as the log's scores

    def collect() -> None:
        # the log keeps one window (1 s): read it every 0.1 s, and no grant is missed
        if log_key:
            for entry in r.zrange(log_key, 0, -1, withscores=True):
                member, score = entry[0], float(entry[1])
                if score >= since_ms:
                    grants[str(member)] = score / 1000

    host0 = host_jiffies()
    first = _send(client, case.task, case.n, case.d)
    _wait_ledger(r, cfg.key("ledger", case.kind), case.n, case.bound(), collect)
    collect()
    host = host_busy(host0, host_jiffies())
    starts, ends = [], []
    nodes: dict[str, int] = {}
    for raw in r.lrange(cfg.key("ledger", case.kind), 0, -1):
        start, end, node = (raw.decode() if isinstance(raw, bytes) else str(raw)).split()
        starts.append(float(start))
        ends.append(float(end))
        nodes[node] = nodes.get(node, 0) + 1
    starts.sort()
    inside = int(r.get(cfg.key("max", case.kind)) or 0)
    split = sorted(nodes.values(), reverse=True) + [0] * NODES
    return Run(case, first, starts, ends, inside, host, sorted(grants.values()), split[:NODES])


# -- windows --------------------------------------------------------------------------------


def most_in_window(times: list[float], period: float = 1.0) -> int:
    """The most of ``times`` (sorted) in any window ``[t, t + period)``."""
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= period:
            first += 1
        most = max(most, last - first + 1)
    return most


def window_counts(times: list[float], period: float = 1.0, step: float = 0.01) -> list[int]:
    """Starts in the windows ``[t, t + period)`` for t from the first start to the last start
    minus ``period`` (every window lies inside the backlog), every ``step``."""
    if len(times) < 2 or times[-1] - times[0] < period:
        return []
    steps = int((times[-1] - period - times[0]) / step)
    counts = []
    for i in range(steps + 1):
        t = times[0] + i * step
        counts.append(bisect.bisect_left(times, t + period) - bisect.bisect_left(times, t))
    return counts


@dataclass
class Summary:
    most: float  # median over runs of the max per window
    worst: int  # the max over all runs
    mean: float  # median over runs of the mean per window
    over: float  # median share of windows above the configured rate
    total: float
    throughput: float
    max_inside: int
    host: float
    incomplete: int
    runs: int
    grants_most: float  # median over runs of the most grants in a window (server clock)
    grants_worst: int
    grants_seen: int  # grants the semaphore's log showed, over all runs (n per run expected)
    splits: list[str]  # bodies per node in each run
    unfinished: list[str]  # "started/sent" of each run that did not finish within its bound
    lag_p50: float  # ms, k-th body start - k-th grant, pooled over the runs
    lag_max: float


def summarize(runs: list[Run]) -> Summary:
    done = [run for run in runs if run.complete]
    # the windows count every run's starts, unfinished runs' too (what they admitted while
    # they ran); total and tasks/s only finished runs
    seen = [run for run in runs if run.starts]
    most = [most_in_window(run.starts) for run in seen]
    means, overs = [], []
    for run in seen:
        counts = window_counts(run.starts)
        if counts:
            means.append(statistics.fmean(counts))
            if not math.isnan(run.case.configured):
                overs.append(sum(c > run.case.configured for c in counts) / len(counts))

    def med(values: list[float]) -> float:
        return statistics.median(values) if values else math.nan

    grants = [most_in_window(run.grants) for run in seen if run.grants]
    # the k-th body start against the k-th grant (both sorted): how far the bodies' clock
    # trails the grants (the hop to the pool, and a pool slot's wait)
    lags = [b - g for run in seen for g, b in zip(run.grants, run.starts, strict=False)]

    return Summary(
        most=med([float(m) for m in most]),
        worst=max(most, default=0),
        mean=med(means),
        over=med(overs),
        total=med([run.total for run in done]),
        throughput=med([run.throughput for run in done]),
        max_inside=max((run.max_inside for run in runs), default=0),
        host=med([run.host for run in runs]),
        incomplete=len(runs) - len(done),
        runs=len(runs),
        grants_most=med([float(g) for g in grants]),
        grants_worst=max(grants, default=0),
        grants_seen=sum(len(run.grants) for run in runs),
        splits=["/".join(map(str, run.split)) for run in runs],
        unfinished=[f"{len(run.starts)}/{run.case.n}" for run in runs if not run.complete],
        lag_p50=med(lags) * 1000,
        lag_max=max(lags, default=math.nan) * 1000,
    )


# -- the adaptive case (not in this build) ---------------------------------------------------


@dataclass
class AdaptiveRun:
    kind: str
    refused: int
    served: int
    most_at_once: int  # the most calls the service served at once (its own count)
    total: float
    lowest: int  # the lowest effective limit seen (sampled every 20 ms)
    final: int  # the effective limit when the run ended


def adaptive_case(
    url: str, broker: str, base: str, logroot: Path, repeats: int, calls: int
) -> list[AdaptiveRun]:
    """Issue 19 item 8: a fake service that refuses (429) above SERVICE_CAPACITY concurrent
    calls; the same calls under a fixed limit of SVC_LIMIT and with ``adaptive=True`` (each
    refusal reports ``throttled(retry_after=0.1)``), on 2 threads nodes with more slots than
    the limit, runs interleaved.  Every run starts from the full limit (``clear_throttle``)."""
    cfg = rate_app.AppConfig(
        redis_url=url, broker_url=broker, prefix=f"{base}:svc", queue=f"{base}-svc-q"
    )
    client = rate_app.make_app(cfg, main="rate-svc-client")
    r = redis.Redis.from_url(url)
    sem = Semaphore(
        rate_app.SVC_ADAPTIVE_NAME, rate_app.SVC_LIMIT, redis=r, key_prefix=cfg.key("sem")
    )
    nodes = start_workers(cfg, client, "threads", logroot / "svc", slots=ADAPTIVE_SLOTS)
    out: list[AdaptiveRun] = []
    try:
        for _ in range(repeats):
            for task, kind in (
                (rate_app.SVC_FIXED, "svc-fixed"),
                (rate_app.SVC_ADAPTIVE, "svc-adaptive"),
            ):
                sem.clear_throttle()
                for key in ("ledger", "svc429", "svcmax", "svcin"):
                    r.delete(cfg.key(key, kind))
                lowest = [rate_app.SVC_LIMIT]

                def sample(lowest: list[int] = lowest) -> None:
                    lowest[0] = min(lowest[0], sem.inspect().effective_limit)

                first = _send(client, task, calls, 0.05)
                done = _wait_ledger(r, cfg.key("ledger", kind), calls, 120.0, each=sample)
                ends = [float(x.split()[0]) for x in r.lrange(cfg.key("ledger", kind), 0, -1)]
                refused = int(r.get(cfg.key("svc429", kind)) or 0)
                out.append(
                    AdaptiveRun(
                        kind,
                        refused,
                        len(ends) - refused,
                        int(r.get(cfg.key("svcmax", kind)) or 0),
                        (max(ends) - first) if done and ends else math.nan,
                        lowest[0] if kind == "svc-adaptive" else rate_app.SVC_LIMIT,
                        sem.inspect().effective_limit
                        if kind == "svc-adaptive"
                        else rate_app.SVC_LIMIT,
                    )
                )
                time.sleep(GAP)
    finally:
        for node in nodes:
            stop_worker(node)
        client.close()
        r.close()
    return out


def report_adaptive(runs: list[AdaptiveRun], calls: int) -> None:
    print()
    print(
        f"Adaptive limits: a fake service that serves {rate_app.SERVICE_CAPACITY} calls at once "
        f"and refuses (429) the rest; {calls} calls of 50 ms sent at once, @limited(limit="
        f"{rate_app.SVC_LIMIT}) on 2 threads nodes -c {ADAPTIVE_SLOTS}; a refused call is not "
        "retried (counted); medians of the runs."
    )
    print()
    print(
        "| case | 429s | served | 429s ÷ calls | most served at once | total s "
        "| lowest / final limit |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind, label in (
        ("svc-fixed", f"fixed limit {rate_app.SVC_LIMIT}"),
        ("svc-adaptive", f"limit {rate_app.SVC_LIMIT}, adaptive=True + throttled(retry_after=0.1)"),
    ):
        rows = [x for x in runs if x.kind == kind]
        if not rows:
            continue

        def med(values: list[float]) -> float:
            return statistics.median(values)

        refused = med([x.refused for x in rows])
        print(
            f"| {label} | {_num(refused, 0)} | {_num(med([x.served for x in rows]), 0)} | "
            f"{_num(refused / calls, 2)} | {_num(med([x.most_at_once for x in rows]), 0)} | "
            f"{_num(med([x.total for x in rows]), 2)} | "
            f"{_num(med([x.lowest for x in rows]), 0)} / {_num(med([x.final for x in rows]), 0)} |"
        )
    fixed = [x.refused for x in runs if x.kind == "svc-fixed"]
    adaptive = [x.refused for x in runs if x.kind == "svc-adaptive"]
    if fixed and adaptive and statistics.median(adaptive):
        print(
            f"\n429s, fixed ÷ adaptive (medians): "
            f"{statistics.median(fixed) / statistics.median(adaptive):.1f}"
        )


# -- main -----------------------------------------------------------------------------------


@dataclass
class PoolResult:
    pool: str
    runs: dict[str, list[Run]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    failure: str = ""
    stopped: list[Worker] = field(default_factory=list)  # every node started, for their logs
    restarts: int = 0  # times the nodes were restarted after an unfinished run


def run_pool(
    pool: str,
    all_cases: list[Case],
    repeats: int,
    url: str,
    broker: str,
    base: str,
    logroot: Path,
    worker_hold: int | None,
) -> PoolResult:
    prefix = f"{base}:{pool}"
    cfg = rate_app.AppConfig(
        redis_url=url,
        broker_url=broker,
        prefix=prefix,
        queue=f"{prefix}:q",
        worker_hold=worker_hold,
    )
    client = rate_app.make_app(cfg, "rate-client")
    r = redis.Redis.from_url(url)
    logdir = logroot / pool
    result = PoolResult(pool, {c.key: [] for c in all_cases})
    workers: list[Worker] = []
    restarts = 0

    def stop_nodes() -> None:
        # the nodes first (their unacknowledged messages go back to the queue), then the queue
        for worker in workers:
            stop_worker(worker)
        with contextlib.suppress(Exception), client.connection_for_write() as conn:
            conn.default_channel.queue_delete(cfg.queue)

    def start_nodes() -> None:
        t0 = time.monotonic()
        workers[:] = start_workers(cfg, client, pool, logdir / f"start{restarts}")
        warm_up(client, r, cfg, pool)
        print(f"  {pool}: nodes ready and warm in {time.monotonic() - t0:.1f} s", file=sys.stderr)

    try:
        start_nodes()
        for rep in range(repeats):  # interleaved, so drift hits every case alike
            for case in all_cases:
                t0 = time.monotonic()
                run = run_case(case, client, r, cfg)
                result.runs[case.key].append(run)
                print(
                    f"  {pool} repeat {rep + 1}/{repeats} {case.key}: "
                    f"{len(run.starts)}/{case.n} bodies (nodes {'/'.join(map(str, run.split))}), "
                    f"max/1s {most_in_window(run.starts)}, "
                    f"total {run.total:.2f} s, {time.monotonic() - t0:.1f} s in all",
                    file=sys.stderr,
                    flush=True,
                )
                if not run.complete:
                    # the next runs would share the nodes with its leftovers: fresh nodes
                    restarts += 1
                    print(
                        f"  {pool} {case.key}: {len(run.starts)} of {case.n} bodies in "
                        f"{case.bound():.0f} s; restarting the nodes",
                        file=sys.stderr,
                    )
                    old_workers = list(workers)
                    stop_nodes()
                    result.stopped.extend(old_workers)
                    workers.clear()
                    _reset(r, cfg)
                    start_nodes()
                time.sleep(GAP)
    except (RuntimeError, TimeoutError) as exc:
        result.failure = str(exc)
    finally:
        stop_nodes()
        client.close()
        cleanup(r, prefix)
        r.close()
    result.stopped.extend(workers)
    result.restarts = restarts
    for worker in result.stopped:
        for line in worker.log().splitlines():
            if any(f" {lvl}/" in line for lvl in ("WARNING", "ERROR", "CRITICAL")):
                result.problems.append(line)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--redis-url", help="Redis to use (default: reuse or start one)")
    parser.add_argument("--broker-url", help="broker (default: the Redis above)")
    parser.add_argument("--quick", action="store_true", help="fewer tasks, 1 repeat")
    parser.add_argument("--repeats", type=int, help="runs per case (default 3; quick 1)")
    parser.add_argument("--tasks", type=int, help="tasks per run of (0)-(b) (default 200)")
    parser.add_argument(
        "--pool", choices=("prefork", "threads", "both"), help="worker pool (default prefork)"
    )
    parser.add_argument(
        "--cases",
        default="0abcd",
        help="which cases to run, by key (default 0abcd: all; d: adaptive)",
    )
    parser.add_argument(
        "--worker-hold",
        type=int,
        help="semaphore_worker_hold for the workers (default: the library's; 0: no gate)",
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the worker logs")
    args = parser.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    n = args.tasks or (80 if args.quick else 200)
    pool_arg = args.pool or "prefork"
    pools = ["prefork", "threads"] if pool_arg == "both" else [pool_arg]
    all_cases = [c for c in cases(n) if c.key in args.cases]
    t_start = time.monotonic()
    base = f"bench-rate-{uuid.uuid4().hex[:12]}"
    logroot = Path(tempfile.mkdtemp(prefix="cs-rate-"))
    results: list[PoolResult] = []
    with redis_target(args.redis_url) as (url, origin):
        broker = args.broker_url or url
        info = redis.Redis.from_url(url)
        try:
            version = str(info.info("server").get("redis_version", "?"))
        finally:
            info.close()
        adaptive_runs: list[AdaptiveRun] = []
        svc_calls = 100 if args.quick else 300
        try:
            for pool in pools:
                results.append(
                    run_pool(pool, all_cases, repeats, url, broker, base, logroot, args.worker_hold)
                )
            if "d" in args.cases:
                adaptive_runs = adaptive_case(url, broker, base, logroot, repeats, svc_calls)
        finally:
            r = redis.Redis.from_url(url)
            try:
                cleanup(r, base)
                left = sum(1 for _ in r.scan_iter(match=f"{base}*", count=1000))
            finally:
                r.close()
    elapsed = time.monotonic() - t_start
    report(results, repeats)
    if adaptive_runs:
        report_adaptive(adaptive_runs, svc_calls)
    failures = [res.failure for res in results if res.failure]
    for res in results:
        if res.restarts:
            print(f"\n{res.pool}: nodes restarted {res.restarts} time(s) after unfinished runs")
    for failure in failures:
        print(f"\nFAILED: {failure}")
    problems = [(res.pool, line) for res in results for line in res.problems]
    if problems:
        print(f"\nworker WARNING/ERROR lines: {len(problems)}; the first ones:")
        for pool, line in problems[:8]:
            print(f"  [{pool}] {line[:300]}")
    if args.keep_logs:
        print(f"worker logs kept in {logroot}")
    else:
        shutil.rmtree(logroot, ignore_errors=True)
    print(
        f"\nRedis {version} at {url} ({origin}); broker {_redact(broker)}.  cleanup: keys under "
        f"{base} deleted, {left} left.  Run time {elapsed:.0f} s."
    )
    return 0 if not failures and not left else 1


def report(results: list[PoolResult], repeats: int) -> None:
    print(
        f"celery-semaphore rate benchmark: {NODES} worker nodes per pool ("
        + ", ".join(f"{res.pool} -c {SLOTS[res.pool]}" for res in results)
        + f"), configured rate {rate_app.RATE}; every case's tasks sent at once; {repeats} "
        f"run(s) per case, interleaved, medians shown; Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs."
    )
    print(f"Library under test: {library_version()}.")
    print()
    header = [
        "case",
        "pool",
        "tasks",
        "limit",
        "configured /s",
        "admits /s (design)",
        "max / 1 s",
        "mean / 1 s",
        "max ÷ configured",
        "mean ÷ configured",
        "windows over",
        "grants max / 1 s",
        "start lag p50 / max ms",
        "total s",
        "tasks/s",
        "unfinished runs",
        "max inside",
        "bodies per node",
        "host CPU",
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|")
    for res in results:
        for runs in res.runs.values():
            if not runs:
                continue
            case = runs[0].case
            s = summarize(runs)
            most = f"{_num(s.most, 0)}" + (f" ({s.worst})" if s.worst != s.most else "")
            grants = "-"
            if case.semaphore:
                grants = f"{_num(s.grants_most, 0)}" + (
                    f" ({s.grants_worst})" if s.grants_worst != s.grants_most else ""
                )
                if s.grants_seen != case.n * s.runs:
                    grants += f" [{s.grants_seen}/{case.n * s.runs} seen]"
            row = [
                case.label,
                res.pool,
                case.tasks(),
                case.limit,
                _num(case.configured, 0),
                _num(case.admits, 0),
                most,
                _num(s.mean, 1),
                _num(s.most / case.configured, 2),
                _num(s.mean / case.configured, 2),
                _pct(s.over),
                grants,
                f"{_num(s.lag_p50, 0)} / {_num(s.lag_max, 0)}" if case.semaphore else "-",
                _num(s.total, 2),
                _num(s.throughput, 1),
                ", ".join(s.unfinished) or "-",
                str(s.max_inside),
                ", ".join(s.splits),
                _pct(s.host),
            ]
            print("| " + " | ".join(row) + " |")
    print()
    for note in (
        "max / 1 s: the most starts in any one-second window (sliding), median over the runs, "
        "the worst run in brackets when it differs.",
        "mean / 1 s: the mean count of the one-second windows between the first and the last "
        "start (the backlog lasted all that time), sampled every 10 ms; median over the runs.",
        "windows over: the share of those windows with more starts than the configured "
        "cluster rate (median over the runs).",
        "Starts are the bodies' own clocks (time.time() on entry, after the pool hands the task "
        "over), so a start granted just before a window",
        "  and run late lands in the next one: with 20 starts granted at each window's opening "
        "and run over the next ~0.1 s, a window of the bodies' clocks",
        "  can hold more than the rate (see grants max and start lag); Celery's per-worker rate "
        "shows as about 2x on either clock.",
        "grants max / 1 s: the same count over the semaphore's own record of its grants "
        "(its starts log, on the Redis server's clock, read every 0.1 s),",
        "  for the @limited rows: what the script admitted, before the hop to the pool.",
        "start lag: the k-th body start minus the k-th grant (both sorted; pooled over the "
        "runs): how late the bodies' clock reads the grants.",
        "admits (design): (a) the configured rate, for the cluster; (b) the configured rate on "
        f"each of the {NODES} workers; (c) min(limit / body, rate).",
        "total: first send to the last body end; tasks/s = tasks / total (finished runs only); "
        "max inside: most bodies running at once (an independent counter), over all runs.",
        "unfinished runs: bodies started / tasks sent, for each run that had not finished "
        "within its bound (10 s + twice its length by design); the windows",
        "  count what such a run started meanwhile; the nodes are then restarted (and the queue "
        "deleted) so that the next run does not share them with its leftovers.",
        "bodies per node: how the broker split the tasks between the two nodes, each run (a "
        "per-worker rate admits less while one node has run out).",
        "host CPU: the share of the machine's CPU time in use by any process during a run "
        "(median); the machine is shared with other jobs.",
    ):
        print(note)


def _num(value: float, digits: int = 2) -> str:
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x * 100:.0f}%"


def _redact(url: str) -> str:
    if "@" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


if __name__ == "__main__":
    sys.exit(main())
