"""End-to-end benchmark: real Celery workers, one table, one run.

    python benchmarks/e2e.py [--quick] [--redis-url URL] [--broker-url URL] [--repeats N]
                             [--pool threads|prefork|both] [--keep-logs]

Redis: ``--redis-url`` as given, else :func:`celery_semaphore.ops.testing.redis_server` (the server
named by ``$CELERY_SEMAPHORE_TEST_REDIS_URL`` or ``redis://127.0.0.1:6379`` when reachable, else
a throwaway ``redis-server``).  The broker is that Redis unless ``--broker-url`` names another.

Every measured run starts its own ``celery -A benchmarks.e2e_app worker`` subprocesses (each in
its own process group, ready when it answers ``control.ping``), with a fresh key prefix and
queue, warms them up, resets the bookkeeping, sends all tasks as fast as one producer can, waits
for the ledger to fill, and stops the workers (SIGTERM to their group, then SIGKILL).  Only the
keys under the run's prefix are deleted (SCAN + DEL, never FLUSHDB), and the queue.

Utilization = N·d / (limit·makespan); makespan runs from the first send to the last recorded
body end.  Bodies record their own start and end (``time.time()``, one host) and an independent
concurrency counter; see ``benchmarks/e2e_app.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
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
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import e2e_app  # benchmarks/e2e_app.py: this script's directory is sys.path[0]
import redis

from celery_semaphore.integration import config as cs_config
from celery_semaphore.ops.testing import redis_server

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 8
SPARE = 16  # worker slots per node in (b)/(c) with the threads pool
SPARE_PREFORK = 12  # ... with prefork (child processes; heavy on a 2-core machine)
NODES = 2
FREE_LIMIT = 10_000  # the (free) row's limit: above any number of tasks in flight
START_TIMEOUT = 60.0


# -- what is measured -----------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    n: int
    d: float  # seconds

    def label(self) -> str:
        return f"{self.n} x {self.d * 1000:g} ms"


@dataclass(frozen=True)
class Settings:
    loads: tuple[Load, ...]
    flood: Load  # the limited flood of (c)
    unlimited: Load  # the unlimited tasks of (c)
    repeats: int


# (c)'s unlimited tasks: 40 fill two waves both alone (32 slots: 32 + 8) and beside the flood
# (the 8 running limited bodies leave 24: 24 + 16), with room to spare.  With 48 (a whole number
# of waves of 24), one node taking a few more of them than it had free slots added a third
# 200 ms wave, alone as well as mixed, so the figure swung between -25 % and +45 % from run to
# run on how kombu happened to split the messages between the two nodes, not on the semaphore.
UNLIMITED = Load(40, 0.2)

FULL = Settings(
    loads=(Load(400, 0.02), Load(200, 0.2)),
    flood=Load(200, 0.2),
    unlimited=UNLIMITED,
    repeats=3,
)
QUICK = Settings(
    loads=(Load(80, 0.02), Load(40, 0.2)),
    flood=Load(40, 0.2),
    unlimited=UNLIMITED,
    repeats=1,
)


@dataclass(frozen=True)
class Design:
    key: str  # "a", "split", "b", "b0", "off", "hand"
    label: str
    task: str  # task name
    kind: str  # ledger kind
    nodes: int
    slots: int  # per node
    pool: str
    conf: tuple[tuple[str, Any], ...] = ()  # app settings for this design's workers only
    limit: int = LIMIT  # the limited task's limit


@dataclass(frozen=True)
class Cell:
    """One measured configuration: a design, a limited (or plain) load, maybe unlimited tasks."""

    design: Design
    load: Load | None  # None: only the unlimited tasks ("alone")
    unlimited: Load | None = None

    @property
    def name(self) -> str:
        load = self.load.label() if self.load else "-"
        extra = f" + {self.unlimited.label()} unlimited" if self.unlimited else ""
        return f"{self.design.key}/{self.design.pool}/{load}{extra}"


def designs(pool: str) -> dict[str, Design]:
    slots = SPARE if pool == "threads" else SPARE_PREFORK
    return {
        "a": Design(
            "a",
            f"(a) dedicated queue, 1 node -c {LIMIT}, no semaphore",
            e2e_app.PLAIN,
            "plain",
            1,
            LIMIT,
            pool,
        ),
        "split": Design(
            "split",
            f"(split) same {NODES} nodes, plain tasks, -c {LIMIT // NODES} each",
            e2e_app.PLAIN,
            "plain",
            NODES,
            LIMIT // NODES,
            pool,
        ),
        "b": Design(
            "b",
            f"(b) @limited(limit={LIMIT}), {NODES} nodes -c {slots}",
            e2e_app.LIMITED,
            "limited",
            NODES,
            slots,
            pool,
        ),
        "b0": Design(
            "b0",
            f"(b) with semaphore_worker_standby=0 (no standby), {NODES} nodes -c {slots}",
            e2e_app.LIMITED,
            "limited",
            NODES,
            slots,
            pool,
            (("semaphore_worker_standby", 0),),
        ),
        "off": Design(
            "off",
            f"(b) with semaphore_enabled=False (CPU only), {NODES} nodes -c {slots}",
            e2e_app.LIMITED,
            "limited",
            NODES,
            slots,
            pool,
            (("semaphore_enabled", False),),
        ),
        "free": Design(
            "free",
            f"(b) with limit {FREE_LIMIT} (never binds: the path, nothing to wait for), "
            f"{NODES} nodes -c {slots}",
            e2e_app.LIMITED,
            "limited",
            NODES,
            slots,
            pool,
            limit=FREE_LIMIT,
        ),
        "floor": Design(
            "floor",
            f"(floor) plain tasks + a core Semaphore acquire/release in the body (limit "
            f"{FREE_LIMIT}, no Celery layer), {NODES} nodes -c {slots}",
            e2e_app.BARE,
            "bare",
            NODES,
            slots,
            pool,
            limit=FREE_LIMIT,
        ),
        "hand": Design(
            "hand",
            f"hand-rolled Redis lock + retry(countdown=1), {NODES} nodes -c {slots}",
            e2e_app.HANDROLLED,
            "handrolled",
            NODES,
            slots,
            pool,
        ),
    }


# -- workers --------------------------------------------------------------------------------


@dataclass
class Worker:
    node: str
    process: subprocess.Popen[bytes]
    logfile: Path

    def log(self) -> str:
        return self.logfile.read_text(errors="replace") if self.logfile.exists() else ""

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM to the worker's own process group, then SIGKILL to it; nothing else."""
        pgid = self.process.pid  # start_new_session=True: the group id is the leader's pid
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError):  # children may outlive the leader
            os.killpg(pgid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(timeout=10)


def group_cpu(workers: list[Worker]) -> float:
    """CPU seconds (user + system) used so far by every live process in the workers' process
    groups (Linux /proc; NaN elsewhere)."""
    groups = {w.process.pid for w in workers}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0.0
    try:
        entries = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return math.nan
    for pid in entries:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) in groups:  # pgrp
            total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return total


def host_jiffies() -> tuple[int, int]:
    """(busy, all) CPU time of the whole host so far, in clock ticks, summed over its CPUs
    (Linux /proc/stat; (0, 0) elsewhere).  Busy is everything but idle and iowait."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    total = sum(fields[:8])  # guest time is already counted in user and nice
    return total - fields[3] - fields[4], total


def host_busy(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of the host's CPU time in use between two :func:`host_jiffies` readings."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else math.nan


def start_workers(
    cfg: e2e_app.AppConfig, client: Any, pool: str, nodes: int, slots: int, logdir: Path
) -> list[Worker]:
    env = dict(os.environ)
    env.update(cfg.environ())
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    started: list[Worker] = []
    try:
        for i in range(nodes):
            node = f"e2e{i}-{uuid.uuid4().hex[:6]}@localhost"
            logfile = logdir / f"{node.split('@')[0]}.log"
            args = [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "benchmarks.e2e_app",
                "worker",
                "-P",
                pool,
                "-c",
                str(slots),
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
                start_new_session=True,
            )
            started.append(Worker(node, proc, logfile))
        for worker in started:
            wait_ready(client, worker)
    except BaseException:
        for worker in started:
            worker.stop(timeout=5)
        raise
    return started


def wait_ready(client: Any, worker: Worker) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if worker.process.poll() is not None:
            raise RuntimeError(f"worker {worker.node} exited early:\n{worker.log()[-3000:]}")
        if client.control.ping(destination=[worker.node], timeout=0.5):
            return
    raise TimeoutError(f"worker {worker.node} not ready in {START_TIMEOUT}s")


# -- one run --------------------------------------------------------------------------------


@dataclass
class Span:
    """The bodies of one kind in one run."""

    n: int
    d: float
    first_send: float
    last_send: float
    bodies: list[tuple[float, float, str]]  # (start, end, how): epoch seconds; see e2e_app
    max_inside: int
    ids: list[str] = field(default_factory=list)  # task ids, in the order of ``bodies``

    @property
    def complete(self) -> bool:
        return len(self.bodies) >= self.n

    @property
    def makespan(self) -> float:
        if not self.complete:
            return math.nan
        return max(b[1] for b in self.bodies) - self.first_send


@dataclass
class Run:
    main: Span | None
    unlimited: Span | None
    parks: int = 0  # ours: "parked for" lines; hand-rolled: retries
    wakes: int = 0  # ours: "re-dispatched" lines
    dups: int = 0  # ours: duplicate copies dropped
    cpu: float = math.nan  # CPU seconds the workers used from the first send to the last end
    host: float = math.nan  # share of the host's CPU time in use meanwhile (all processes)
    problems: list[str] = field(default_factory=list)  # WARNING+ log lines
    samples: list[str] = field(default_factory=list)  # a few park/wake lines


def _poll_timeout(cell: Cell) -> float:
    work = 0.0
    if cell.load:
        work += cell.load.n * cell.load.d / LIMIT
    if cell.unlimited:
        work += cell.unlimited.n * cell.unlimited.d / LIMIT
    return 60.0 + 10.0 * work


def _send(client: Any, task: str, load: Load) -> tuple[float, float]:
    first = time.time()
    with client.producer_or_acquire() as producer:
        for _ in range(load.n):
            client.send_task(task, args=(load.d,), producer=producer)
    return first, time.time()


def _bodies(
    r: redis.Redis, cfg: e2e_app.AppConfig, kind: str
) -> tuple[list[tuple[float, float, str]], list[str]]:
    out, ids = [], []
    for raw in r.lrange(cfg.key("ledger", kind), 0, -1):
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        start, end, _, how, task_id = text.split()
        out.append((float(start), float(end), how))
        ids.append(task_id)
    return out, ids


def _reset_bookkeeping(r: redis.Redis, cfg: e2e_app.AppConfig) -> None:
    for pattern in ("ledger:*", "max:*", "hand:retries"):
        for key in list(r.scan_iter(match=cfg.key(pattern))):
            r.delete(key)


def _wait_ledgers(
    r: redis.Redis, cfg: e2e_app.AppConfig, wanted: dict[str, int], timeout: float
) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        pipe = r.pipeline(transaction=False)
        for kind in wanted:
            pipe.llen(cfg.key("ledger", kind))
        lengths = pipe.execute()
        if all(int(n) >= want for n, want in zip(lengths, wanted.values(), strict=True)):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def run_cell(
    cell: Cell,
    url: str,
    broker: str,
    base: str,
    index: int,
    logroot: Path,
    conf: dict[str, Any],
    limit: int | None = None,
) -> Run:
    prefix = f"{base}:r{index:03d}"
    cfg = e2e_app.AppConfig(
        redis_url=url,
        broker_url=broker,
        prefix=prefix,
        queue=f"{prefix}:q",
        limit=cell.design.limit if limit is None else limit,
        conf={**conf, **dict(cell.design.conf)},
    )
    design = cell.design
    client = e2e_app.make_app(cfg, "e2e-client")
    r = redis.Redis.from_url(url)
    logdir = logroot / f"r{index:03d}"
    logdir.mkdir(parents=True)
    workers: list[Worker] = []
    try:
        workers = start_workers(cfg, client, design.pool, design.nodes, design.slots, logdir)
        # warm-up: pool threads/children, connections, scripts; then forget it all
        warm = Load(2 * design.nodes * design.slots, 0.005)
        _send(client, e2e_app.PLAIN, warm)
        wanted = {"plain": warm.n}
        if cell.load is not None and design.task != e2e_app.PLAIN:
            # @limited: as many as the plain ones: with only a few, the pool processes that
            # had none made their semaphore, scripts and connection in the measured run
            # (prefork: about 0.3 ms of CPU per task of 400 in the children).  Hand-rolled:
            # LIMIT (more would wait out retry countdowns)
            n = warm.n if design.task in (e2e_app.LIMITED, e2e_app.BARE) else cfg.limit
            _send(client, design.task, Load(n, 0.001))
            wanted[design.kind] = n
        if not _wait_ledgers(r, cfg, wanted, 60.0):
            raise RuntimeError(f"{cell.name}: warm-up did not finish in 60 s")
        time.sleep(0.2)
        _reset_bookkeeping(r, cfg)
        cpu0 = group_cpu(workers)
        host0 = host_jiffies()

        sends: dict[str, tuple[Load, float, float]] = {}
        if cell.load is not None:
            first, last = _send(client, design.task, cell.load)
            sends[design.kind] = (cell.load, first, last)
        if cell.unlimited is not None:
            first, last = _send(client, e2e_app.PLAIN, cell.unlimited)
            sends["plain"] = (cell.unlimited, first, last)
        _wait_ledgers(r, cfg, {k: v[0].n for k, v in sends.items()}, _poll_timeout(cell))
        host = host_busy(host0, host_jiffies())
        cpu = group_cpu(workers) - cpu0

        spans: dict[str, Span] = {}
        for kind, (load, first, last) in sends.items():
            bodies, ids = _bodies(r, cfg, kind)
            spans[kind] = Span(
                load.n, load.d, first, last, bodies, int(r.get(cfg.key("max", kind)) or 0), ids
            )
        for kind, span in spans.items():
            with open(logdir / f"ledger-{kind}.txt", "w") as f:
                f.write(f"# first_send {span.first_send:.6f} last_send {span.last_send:.6f}\n")
                f.writelines(
                    f"{a:.6f} {b:.6f} {how} {task_id}\n"
                    for (a, b, how), task_id in zip(span.bodies, span.ids, strict=True)
                )
        main = spans.get(design.kind) if cell.load is not None else None
        run = Run(
            main=main,
            unlimited=spans.get("plain") if cell.unlimited else None,
            cpu=cpu,
            host=host,
        )
        if design.key == "hand":
            run.parks = int(r.get(cfg.key("hand", "retries")) or 0)
    finally:
        for worker in workers:
            worker.stop()
        with contextlib.suppress(Exception), client.connection_for_write() as conn:
            conn.default_channel.queue_delete(cfg.queue)
        client.close()
        cleanup(r, prefix)
        r.close()
    for worker in workers:
        _read_log(worker.log(), run)
    return run


def _read_log(text: str, run: Run) -> None:
    for line in text.splitlines():
        if "parked for" in line:
            run.parks += 1
            if len(run.samples) < 3:
                run.samples.append(line)
        elif "re-dispatched the parked task" in line:
            run.wakes += 1
            if len(run.samples) < 6:
                run.samples.append(line)
        elif "is a duplicate" in line:
            run.dups += 1
        elif any(f" {lvl}/" in line for lvl in ("WARNING", "ERROR", "CRITICAL")):
            run.problems.append(line)


def cleanup(r: redis.Redis, prefix: str) -> int:
    """Delete the keys under ``prefix:`` (SCAN + DEL, nothing else); the number deleted."""
    deleted = 0
    for _ in range(10):
        keys = list(r.scan_iter(match=f"{prefix}:*", count=1000))
        if not keys:
            break
        for i in range(0, len(keys), 500):
            deleted += int(r.delete(*keys[i : i + 500]))
    return deleted


# -- statistics -----------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def handoffs(span: Span, units: int) -> tuple[list[tuple[float, str]], int]:
    """Handoff latencies (seconds, with the starting body's ``how``) and the number of starts
    that found no free unit.

    Units are modelled FIFO: ``units`` are free at the start; every body end frees one unit
    (stamped with its end time), every body start takes the unit free the longest.  When the
    unit a start takes was freed by an end after the last task was sent (so work was waiting
    for it), latency = start - that end.  With one unit free this is "the start minus the
    latest end before it"; when releases overlap it never pairs two starts with one end."""
    events = sorted(
        [(b[1], 0, "") for b in span.bodies] + [(b[0], 1, b[2]) for b in span.bodies]
    )  # at equal times the end comes first
    free: deque[float | None] = deque([None] * units)
    out: list[tuple[float, str]] = []
    over = 0
    for t, is_start, how in events:
        if not is_start:
            free.append(t)
            continue
        if not free:
            over += 1
            continue
        freed = free.popleft()
        if freed is not None and freed >= span.last_send:
            out.append((t - freed, how))
    return out, over


def strict_handoffs(span: Span, units: int) -> list[tuple[float, str]]:
    """The causal subset: starts made while exactly one unit was free (``units - 1`` bodies
    running), latency = start - the latest end before it (an end after the last send)."""
    events = sorted([(b[1], 0, "") for b in span.bodies] + [(b[0], 1, b[2]) for b in span.bodies])
    running = 0
    last_end: float | None = None
    out: list[tuple[float, str]] = []
    for t, is_start, how in events:
        if not is_start:
            running -= 1
            last_end = t
            continue
        if running == units - 1 and last_end is not None and last_end >= span.last_send:
            out.append((t - last_end, how))
        running += 1
    return out


def by_path(runs: list[Run]) -> str:
    """Single-free-unit handoffs split by how the starting body's task got its permit."""
    paths: dict[str, list[float]] = {}
    for run in runs:
        if run.main is not None:
            for lat, how in strict_handoffs(run.main, LIMIT):
                paths.setdefault(how, []).append(lat * 1000)
    names = {
        "d": "on first delivery, through the gate",
        "s": "stood by in its slot",
        "p": "after parking",
        "-": "all",
    }
    return "; ".join(
        f"{names.get(how, how)}: p50 {_num(percentile(v, 50), 1)} p99 "
        f"{_num(percentile(v, 99), 1)} ms (n={len(v)})"
        for how, v in sorted(paths.items())
    )


@dataclass
class Summary:
    makespan: float  # median over repeats
    util: float
    max_inside: int  # over all repeats
    p50: float  # handoff, ms, pooled over repeats
    p99: float
    handoff_n: int
    parks: float  # per run
    wakes: float
    dups: float
    unlimited: float  # median makespan of the unlimited tasks, s (NaN if none)
    cpu: float  # median worker CPU seconds per run
    cpu_task: float  # median worker CPU ms per task sent in the measured part of a run
    host: float  # median share of the host's CPU time in use during a run
    incomplete: int  # runs that did not finish in time


def _cpu_ms_per_task(run: Run) -> float:
    tasks = sum(s.n for s in (run.main, run.unlimited) if s is not None)
    return run.cpu * 1000 / tasks if tasks else math.nan


def summarize(runs: list[Run], units: int) -> Summary:
    spans = [r.main for r in runs if r.main is not None]
    makespans = [s.makespan for s in spans]
    incomplete = sum(1 for s in spans if not s.complete)
    incomplete += sum(1 for r in runs if r.unlimited is not None and not r.unlimited.complete)
    good = [m for m in makespans if not math.isnan(m)]
    makespan = statistics.median(good) if good else math.nan
    util = math.nan
    if spans and good:
        util = spans[0].n * spans[0].d / (LIMIT * makespan)
    samples: list[float] = []
    for s in spans:
        samples += [lat for lat, _ in handoffs(s, units)[0]]
    unl = [r.unlimited.makespan for r in runs if r.unlimited is not None]
    unl_good = [m for m in unl if not math.isnan(m)]
    n = max(1, len(runs))
    return Summary(
        makespan=makespan,
        util=util,
        max_inside=max((s.max_inside for s in spans), default=0),
        p50=percentile(samples, 50) * 1000,
        p99=percentile(samples, 99) * 1000,
        handoff_n=len(samples),
        parks=sum(r.parks for r in runs) / n,
        wakes=sum(r.wakes for r in runs) / n,
        dups=sum(r.dups for r in runs) / n,
        unlimited=statistics.median(unl_good) if unl_good else math.nan,
        cpu=statistics.median([r.cpu for r in runs]) if runs else math.nan,
        cpu_task=statistics.median([_cpu_ms_per_task(r) for r in runs]) if runs else math.nan,
        host=statistics.median([r.host for r in runs]) if runs else math.nan,
        incomplete=incomplete,
    )


# -- output ---------------------------------------------------------------------------------


def render(header: list[str], rows: list[list[str]]) -> str:
    """Plain-text table; first three columns left-aligned, the rest right-aligned.  A row with a
    single cell is a section title."""
    cells = [r for r in rows if len(r) > 1]
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]

    def line(row: list[str]) -> str:
        if len(row) == 1:
            return row[0]
        out = [c.ljust(w) for c, w in zip(row[:3], widths[:3], strict=True)]
        out += [c.rjust(w) for c, w in zip(row[3:], widths[3:], strict=True)]
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def _num(value: float, digits: int = 2) -> str:
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


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


# -- main -----------------------------------------------------------------------------------


def plan(settings: Settings, pools: list[str]) -> list[Cell]:
    cells: list[Cell] = []
    for pool in pools:
        ds = designs(pool)
        for load in settings.loads:
            cells += [Cell(ds[key], load) for key in ("a", "split", "b", "hand")]
        cells.append(Cell(ds["b0"], settings.loads[0]))  # the same without standby
        cells.append(Cell(ds["off"], settings.loads[0]))  # CPU of plain bodies, same nodes
        cells.append(Cell(ds["free"], settings.loads[0]))  # the limited path, no waiting
        cells.append(Cell(ds["floor"], settings.loads[0]))  # two round trips, no Celery layer
    ds = designs(pools[0])
    cells += [
        Cell(ds["b"], settings.flood, settings.unlimited),
        Cell(ds["hand"], settings.flood, settings.unlimited),
        Cell(ds["b"], None, settings.unlimited),  # the unlimited tasks alone
    ]
    return cells


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--redis-url", help="Redis to use (default: reuse or start one)")
    parser.add_argument("--broker-url", help="broker (default: the Redis above)")
    parser.add_argument("--quick", action="store_true", help="fewer tasks (1-2 minutes)")
    parser.add_argument("--repeats", type=int, help="runs per cell (default 3; quick 1)")
    parser.add_argument(
        "--pool",
        choices=("threads", "prefork", "both"),
        default="threads",
        help="worker pool for (a), (b) and the hand-rolled rows (default threads)",
    )
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the worker logs and the runs' ledgers"
    )
    parser.add_argument(
        "--only", help="run only the cells whose name contains this text (for analysis)"
    )
    parser.add_argument(
        "--conf",
        default="{}",
        help="JSON dict of extra app settings for every worker, e.g. semaphore_* (printed)",
    )
    args = parser.parse_args(argv)
    conf = dict(json.loads(args.conf))
    settings = QUICK if args.quick else FULL
    repeats = args.repeats or settings.repeats
    pools = ["threads", "prefork"] if args.pool == "both" else [args.pool]
    t_start = time.monotonic()
    base = f"bench-e2e-{uuid.uuid4().hex[:12]}"
    logroot = Path(tempfile.mkdtemp(prefix="cs-e2e-"))
    cells = plan(settings, pools)
    if args.only:
        cells = [c for c in cells if args.only in c.name]
    results: dict[str, list[Run]] = {c.name: [] for c in cells}

    with redis_target(args.redis_url) as (url, origin):
        broker = args.broker_url or url
        info = redis.Redis.from_url(url)
        try:
            version = str(info.info("server").get("redis_version", "?"))
        finally:
            info.close()
        index = 0
        try:
            for rep in range(repeats):  # interleaved, so drift hits every cell alike
                for cell in cells:
                    index += 1
                    t0 = time.monotonic()
                    run = run_cell(cell, url, broker, base, index, logroot, conf)
                    results[cell.name].append(run)
                    span = run.main or run.unlimited
                    print(
                        f"  run {index:3d} (repeat {rep + 1}/{repeats}) {cell.name}: makespan "
                        f"{_num(span.makespan if span else math.nan, 3)} s, "
                        f"{time.monotonic() - t0:.1f} s in all",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            r = redis.Redis.from_url(url)
            try:
                cleanup(r, base)
                left = sum(1 for _ in r.scan_iter(match=f"{base}*", count=1000))
            finally:
                r.close()
    elapsed = time.monotonic() - t_start
    summaries = {c.name: summarize(results[c.name], LIMIT) for c in cells}

    if args.only:  # analysis: no table, a line per cell
        for c in cells:
            s = summaries[c.name]
            print(
                f"{c.name}: makespan {_num(s.makespan, 3)} s, util {_num(s.util)}, max "
                f"{s.max_inside}, handoff p50 {_num(s.p50, 1)} p99 {_num(s.p99, 1)} ms, parks "
                f"{_num(s.parks, 0)}, wakes {_num(s.wakes, 0)}, dups {_num(s.dups, 0)}, "
                f"cpu {_num(s.cpu, 1)} s, host CPU busy {_pct0(s.host)}, unlimited "
                f"{_num(s.unlimited, 3)} s; handoffs "
                f"{by_path(results[c.name])}"
            )
    else:
        report(settings, pools, repeats, summaries, results, conf)
    problems = [(name, line) for name, runs in results.items() for r in runs for line in r.problems]
    incomplete = {name: s.incomplete for name, s in summaries.items() if s.incomplete}
    for name, count in incomplete.items():
        print(f"INCOMPLETE: {name}: {count} run(s) did not finish within the time bound")
    if problems:
        print(f"worker WARNING/ERROR lines: {len(problems)}; the first ones:")
        for name, line in problems[:8]:
            print(f"  [{name}] {line[:300]}")
    if args.keep_logs:
        print(f"worker logs and ledgers kept in {logroot}")
    else:
        shutil.rmtree(logroot, ignore_errors=True)
    print(
        f"Redis {version} at {url} ({origin}); broker {_redact(broker)}.  cleanup: keys under "
        f"{base} deleted, {left} left.  Run time {elapsed:.0f} s ({index} runs)."
    )
    return 0 if not incomplete and not left else 1


def report(
    settings: Settings,
    pools: list[str],
    repeats: int,
    summaries: dict[str, Summary],
    results: dict[str, list[Run]],
    conf: dict[str, Any],
) -> None:
    slots = {p: SPARE if p == "threads" else SPARE_PREFORK for p in pools}
    opts = cs_config.resolve(conf, {})
    print(
        f"celery-semaphore end-to-end benchmark: limit {LIMIT}; Python "
        f"{sys.version.split()[0]}, {os.cpu_count()} CPUs; {repeats} run(s) per cell, "
        "interleaved; fresh workers, queue and keys for every run."
    )
    print(
        f"(a): 1 node -c {LIMIT} on a dedicated queue, no semaphore.  (split): the same {NODES} "
        f"nodes as (b), plain tasks, -c {LIMIT // NODES} each ({LIMIT} slots in all), no "
        "semaphore.  (b), hand-rolled, (c): "
        f"{NODES} nodes, spare concurrency ("
        + ", ".join(f"{p} -c {slots[p]} each = {NODES * slots[p]} slots" for p in pools)
        + f" for a limit of {LIMIT})."
    )
    print(
        "Pool: threads (the bodies sleep, and prefork children on 2 cores mostly measure CPU "
        "contention); the same pool for (a)."
        if pools == ["threads"]
        else f"Pools: {', '.join(pools)}; (c) uses {pools[0]}."
    )
    print(
        ("Semaphore settings: the library defaults: " if not conf else f"Settings: {conf}; ")
        + f"semaphore_worker_hold={conf.get('semaphore_worker_hold', 1000)} (the gate; 0: "
        f"off), slot_wait_timeout={opts.slot_wait_timeout:g}s, "
        f"slot_waiters={opts.slot_waiters} (None = the limit), "
        f"retry_backoff={opts.retry_backoff:g}s, retry_backoff_max={opts.retry_backoff_max:g}s, "
        f"retry_jitter={opts.retry_jitter}, lease_ttl={opts.lease_ttl:g}s."
    )
    print(
        "Celery defaults (worker_prefetch_multiplier=4, early ack); workers --without-gossip "
        "--without-mingle, -l WARNING with celery_semaphore.* at INFO."
    )
    print(f"Library under test: {library_version()}.")
    print()
    header = [
        "case",
        "pool",
        "tasks",
        "makespan s",
        "util",
        "vs (a)",
        "vs split",
        "max",
        "handoff p50 ms",
        "p99 ms",
        "parks",
        "wakes",
        "dups",
        "CPU s",
        "CPU ms/task",
        "host CPU",
        "unl. alone s",
        "unl. mixed s",
        "slowdown",
    ]
    rows: list[list[str]] = []
    for pool in pools:
        ds = designs(pool)
        for load in settings.loads:
            base_util = summaries[Cell(ds["a"], load).name].util
            split_util = summaries[Cell(ds["split"], load).name].util
            for key in ("a", "split", "b", "hand"):
                s = summaries[Cell(ds[key], load).name]
                rows.append(_row(ds[key].label, pool, load.label(), s, base_util, split_util))
        short = settings.loads[0]
        b0 = summaries[Cell(ds["b0"], short).name]
        rows.append(
            _row(
                ds["b0"].label,
                pool,
                short.label(),
                b0,
                summaries[Cell(ds["a"], short).name].util,
                summaries[Cell(ds["split"], short).name].util,
            )
        )
        off = summaries[Cell(ds["off"], settings.loads[0]).name]
        row = _row(ds["off"].label, pool, settings.loads[0].label(), off, math.nan, math.nan)
        row[5] = "-"  # over the limit by design: its makespan is not comparable
        rows.append(row)
        free = summaries[Cell(ds["free"], settings.loads[0]).name]
        row = _row(ds["free"].label, pool, settings.loads[0].label(), free, math.nan, math.nan)
        row[5] = "-"  # the same: only its makespan and CPU are compared, in the targets
        rows.append(row)
        floor = summaries[Cell(ds["floor"], settings.loads[0]).name]
        row = _row(ds["floor"].label, pool, settings.loads[0].label(), floor, math.nan, math.nan)
        row[5] = "-"
        rows.append(row)
    ds = designs(pools[0])
    alone = summaries[Cell(ds["b"], None, settings.unlimited).name].unlimited
    tasks = f"{settings.flood.label()} + {settings.unlimited.n} unl."
    for key, label in (("b", "(c) @limited flood + unlimited"), ("hand", "(c) hand-rolled ditto")):
        s = summaries[Cell(ds[key], settings.flood, settings.unlimited).name]
        row = _row(label, pools[0], tasks, s, math.nan, math.nan)
        row[-3:] = [_num(alone, 3), _num(s.unlimited, 3), _pct(s.unlimited / alone - 1)]
        rows.append(row)
    print(render(header, rows))
    print()
    for note in (
        "Utilization means N·d / (limit·makespan); makespan runs from the first send to the "
        "last finish (median of the runs).",
        "vs (a), vs split: util / util of (a), of (split), at the same load and pool.  max: "
        "most simultaneous bodies (an INCR/DECR counter in",
        "  Redis, independent of any semaphore), over all runs.  CPU s: CPU seconds all worker "
        "processes used during the measured part of a run",
        "  (median); CPU ms/task: the same divided by the tasks sent in it (median of the runs).",
        "  semaphore_enabled=False: the (b) task and nodes with the semaphore off (bodies run "
        f"at once, up to {NODES} x the slots): plain bodies'",
        "  CPU on the same nodes; its makespan is not comparable.  limit "
        f"{FREE_LIMIT}: the (b) path with a limit that never binds (no waiting, no",
        "  handoff): what the limited path alone costs in CPU and makespan on these nodes.  "
        "(floor): the same nodes, plain tasks whose body",
        "  acquires and releases a core Semaphore that never refuses: the two round trips any "
        "Redis-backed limit makes per task, nothing else.",
        f"host CPU: the share of the machine's CPU time ({os.cpu_count()} CPUs) in use, by "
        "any process (the sender, Redis and the workers share it),",
        "  from the first send until every body was recorded (median); near 100% the run is "
        "bound by CPU, and every step of it waits its turn.",
        f"handoff: units are modelled FIFO ({LIMIT} free at first; each body end frees one, "
        "each body start takes the one free longest);",
        "  a start that takes a unit freed by an end after the last send counts, latency = "
        "start - that end (with one unit free: the start",
        "  minus the latest end before it).  It includes the release, wake-up, acquire and "
        "bookkeeping round trips; pooled over the runs.",
        "parks: per run; ours: 'parked for' log lines (a copy re-published with a countdown); "
        "hand-rolled: self.retry(countdown=1) calls.",
        "wakes: per run, parked tasks re-dispatched by a release ('re-dispatched' lines); "
        "dups: copies dropped as duplicates.",
        f"(c): the limited flood is sent first, then {settings.unlimited.label()} unlimited "
        f"tasks ({e2e_app.PLAIN}); their makespan runs from their first",
        "  send to their last finish; 'alone' = the same unlimited tasks on the same workers "
        f"with nothing else ({alone:.3f} s).",
    ):
        print(note)

    print()
    print("targets (issue 18; computed from the numbers above):")
    for pool in pools:
        ds = designs(pool)
        samples: list[float] = []
        for i, load in enumerate(settings.loads):
            a = summaries[Cell(ds["a"], load).name]
            split = summaries[Cell(ds["split"], load).name]
            b = summaries[Cell(ds["b"], load).name]
            ratio = b.util / split.util if split.util else math.nan
            want = 0.95 if i == 0 else 0.98
            print(
                f"  {_verdict(ratio >= want)}  {pool} {load.label()}: (b) util >= {want} x "
                f"(split): {_num(b.util)} / {_num(split.util)} = {_num(ratio)}; (b)/(a) = "
                f"{_num(b.util)} / {_num(a.util)} = {_num(b.util / a.util if a.util else math.nan)}"
                f"; (split)/(a) = {_num(split.util / a.util if a.util else math.nan)}"
            )
            print(
                f"  {_verdict(b.max_inside == LIMIT)}  {pool} {load.label()}: (b) most "
                f"simultaneous bodies == {LIMIT}: {b.max_inside}"
            )
            for run in results[Cell(ds["b"], load).name]:
                if run.main is not None:
                    samples += [lat for lat, _ in handoffs(run.main, LIMIT)[0]]
        p50 = percentile(samples, 50) * 1000
        p99 = percentile(samples, 99) * 1000
        want_p50 = 1.0 if pool == "threads" else 1.5
        print(
            f"  {_verdict(p50 <= want_p50 and p99 <= 10.0)}  {pool}: (b) handoff p50 <= "
            f"{want_p50:g} ms and p99 <= 10 ms (both loads, {len(samples)} handoffs): "
            f"p50 {_num(p50)} ms, p99 {_num(p99)} ms"
        )
        short = settings.loads[0]
        split_span = summaries[Cell(ds["split"], short).name].makespan
        spans = ", ".join(
            f"{key} {_num(summaries[Cell(ds[key], short).name].makespan, 3)} s"
            for key in ("off", "floor", "free", "b")
        )
        print(
            f"  info  {pool} {short.label()}: 0.95 x (split) means a makespan <= "
            f"{_num(split_span / 0.95, 3)} s; the same run's makespans: {spans} (a row above "
            "the bound misses it whatever happens after it)"
        )
        b_cpu = summaries[Cell(ds["b"], short).name].cpu_task
        floor_cpu = summaries[Cell(ds["floor"], short).name].cpu_task
        off_cpu = summaries[Cell(ds["off"], short).name].cpu_task
        print(
            f"  info  {pool} {short.label()}: worker CPU per task of the two round trips alone "
            f"(floor - off): {_num(floor_cpu)} - {_num(off_cpu)} = {_num(floor_cpu - off_cpu)} "
            "ms, of the 0.5 ms the target allows the whole limited path"
        )
        for key in ("off", "split"):
            base = summaries[Cell(ds[key], short).name].cpu_task
            extra = b_cpu - base
            print(
                f"  {_verdict(extra <= 0.5)}  {pool} {short.label()}: worker CPU per limited task "
                f"above plain tasks on the same nodes ({key}) <= 0.5 ms: {_num(b_cpu)} - "
                f"{_num(base)} = {_num(extra)} ms"
            )
    ds = designs(pools[0])
    mixed = summaries[Cell(ds["b"], settings.flood, settings.unlimited).name]
    slow = mixed.unlimited / alone - 1
    print(
        f"  {_verdict(slow <= 0.10)}  (c) unlimited tasks slowed by <= 10%: {_pct(slow)} "
        f"({_num(mixed.unlimited, 3)} s vs {_num(alone, 3)} s alone)"
    )
    print()
    print(
        "(b) handoffs made while exactly one unit was free (start - the latest end), by how "
        "the starting task got its permit:"
    )
    for pool in pools:
        ds = designs(pool)
        for load in settings.loads:
            print(f"  {pool} {load.label()}: {by_path(results[Cell(ds['b'], load).name])}")
        short = settings.loads[0]
        print(
            f"  {pool} {short.label()} without standby: "
            f"{by_path(results[Cell(ds['b0'], short).name])}"
        )
    print(
        "  'on first delivery': the task waited where its first delivery put it (held by the "
        "worker's gate, or without a gate in its slot) and was woken by the release; 'after "
        "parking': a re-published"
    )
    print("  copy (woken by a release, or back after its countdown).")


def _row(
    label: str, pool: str, tasks: str, s: Summary, base_util: float, split_util: float
) -> list[str]:
    return [
        label,
        pool,
        tasks,
        _num(s.makespan, 3),
        _num(s.util),
        _ratio(s.util, base_util),
        _ratio(s.util, split_util),
        str(s.max_inside),
        _num(s.p50, 1),
        _num(s.p99, 1),
        _num(s.parks, 0),
        _num(s.wakes, 0),
        _num(s.dups, 0),
        _num(s.cpu, 1),
        _num(s.cpu_task, 2),
        _pct0(s.host),
        "",
        "",
        "",
    ]


def library_version() -> str:
    """The checkout's commit, and whether celery_semaphore/ has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "celery_semaphore"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return f"celery-semaphore {_dist_version()} (no git)"
    changed = [line[3:] for line in dirty if line.strip()]
    extra = f", uncommitted changes in {', '.join(changed)}" if changed else ""
    return f"celery-semaphore {_dist_version()} at git {head}{extra}"


def _dist_version() -> str:
    from celery_semaphore import __version__

    return __version__


def _ratio(x: float, base: float) -> str:
    return _num(x / base) if base and not math.isnan(base) else "-"


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x * 100:+.0f}%"


def _pct0(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x * 100:.0f}%"


def _redact(url: str) -> str:
    if "@" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


if __name__ == "__main__":
    sys.exit(main())
