"""What idle workers cost Redis after they used N semaphore names (issue 31).

For each N (default 0, 100, 1000): a fresh prefork worker (-c 4) and a fresh threads worker
(-c 8) run a few short tasks on each of N names (``@limited("idle:{tenant}", limit=4)``,
10 ms each, ``--per-name`` tasks per name: fewer than the limit, so none waits), then idle.
While they idle (``--idle`` seconds, after ``--settle`` seconds), the benchmark reads the
semaphore Redis's ``INFO commandstats`` and ``INFO cpu`` before and after, and the workers'
CPU time from ``/proc``.  The semaphores live on a Redis server of their own, started here,
so every command counted is one of our clients' (the broker and the results are on another
server, also started here).

Prints one table: names used, commands/s while idle (``INFO commandstats`` counts the commands
a script runs too), of which script calls, the busiest command, Redis CPU and the workers' CPU
(percent of one core), and the threads worker's RSS.  Bounded: each
wait below has a deadline, and only the processes started here are stopped.

    .venv/bin/python benchmarks/idle_cost.py                 # 0, 100, 1000 names
    .venv/bin/python benchmarks/idle_cost.py --names 0 100 --idle 10

``benchmarks/scale.py`` runs the same measurement up to 10,000 names, and tasks/s over one
name against many, with this file's workers (:func:`session`).

To compare with another checkout (e.g. main), run this file from that checkout's root with
its package first on ``PYTHONPATH``: the workers import the package from the current root.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from celery_semaphore import limited

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# -- the app the workers run (configured from the environment) ---------------------------------

BROKER = os.environ.get("IDLE_BROKER", "redis://127.0.0.1:6379/0")
SEMAPHORES = os.environ.get("IDLE_REDIS", BROKER)
PREFIX = os.environ.get("IDLE_PREFIX", "idle-cost")
LIMIT = int(os.environ.get("IDLE_LIMIT", "4"))  # each name's limit (benchmarks/scale.py sets it)

app = Celery("idle_cost", broker=BROKER, backend=BROKER)
app.conf.update(
    semaphore_redis_url=SEMAPHORES,
    semaphore_key_prefix=PREFIX,
    task_default_queue=f"{PREFIX}-q",
    worker_prefetch_multiplier=4,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="idle.work")  # type: ignore[untyped-decorator]
@limited("idle:{tenant}", limit=LIMIT)
def work(tenant: str, seconds: float = 0.01) -> str:
    time.sleep(seconds)
    return tenant


# -- the measurement ------------------------------------------------------------------------------


def _calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def _redis_cpu(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def _proc_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) of ``pids`` so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Session:
    """Workers started on a fresh key prefix, a sender for their queue, and a client of the
    semaphores' Redis (see :func:`session`)."""

    prefix: str
    client: redis.Redis
    sender: Celery
    workers: list[Any] = field(default_factory=list)

    def pids(self) -> list[int]:
        """The workers' main processes and their pool children."""
        return [p for w in self.workers for p in [w.process.pid, *w.child_pids()]]


@contextmanager
def servers() -> Iterator[tuple[str, str]]:
    """Two throwaway Redis servers: (broker and results URL, semaphores URL); stopped on exit."""
    from celery_semaphore.ops.testing import start_redis_server

    broker_server = start_redis_server()
    try:
        sem_server = start_redis_server()
        try:
            yield broker_server.url(0), sem_server.url(0)
        finally:
            sem_server.stop()
    finally:
        broker_server.stop()


@contextmanager
def session(
    broker: str, sems: str, pools: list[tuple[str, int]], limit: int = 4
) -> Iterator[Session]:
    """Start one worker per ``(pool, concurrency)`` running :func:`work` with each name's limit
    ``limit``; on exit stop them and delete the prefix's keys (only what was started here)."""
    from tests.integration.workers import Env, start_worker

    prefix = f"idle-{uuid.uuid4().hex[:8]}"
    more_env = {"IDLE_BROKER": broker, "IDLE_REDIS": sems, "IDLE_PREFIX": prefix}
    env = Env(
        redis_url=broker,
        broker_url=broker,
        prefix=prefix,
        app_module="benchmarks.idle_cost",
        more_env={**more_env, "IDLE_LIMIT": str(limit)},
    )
    sender = Celery("idle-sender", broker=broker, backend=broker)
    sender.conf.update(task_default_queue=f"{prefix}-q", broker_connection_retry_on_startup=True)
    run = Session(prefix, redis.Redis.from_url(sems), sender)
    try:
        for pool, concurrency in pools:
            run.workers.append(start_worker(env, pool=pool, concurrency=concurrency, name=pool))
        yield run
    finally:
        for worker in run.workers:
            worker.stop()
        sender.close()
        for key in run.client.scan_iter(match=f"{prefix}*", count=1000):
            run.client.delete(key)
        run.client.close()


def run_one(names: int, args: argparse.Namespace, broker: str, sems: str) -> dict[str, Any]:
    with session(broker, sems, [("prefork", 4), ("threads", 8)]) as run:
        client = run.client
        sent = [
            run.sender.send_task("idle.work", (f"t{n}",))
            for n in range(names)
            for _ in range(args.per_name)
        ]
        deadline = time.monotonic() + args.bound
        for result in sent:
            result.get(timeout=max(1.0, deadline - time.monotonic()))
        time.sleep(args.settle)
        pids = run.pids()
        before, cpu_before, proc_before = _calls(client), _redis_cpu(client), _proc_cpu(pids)
        started = time.monotonic()
        time.sleep(args.idle)
        after, cpu_after, proc_after = _calls(client), _redis_cpu(client), _proc_cpu(pids)
        took = time.monotonic() - started
        delta = {k: after[k] - before.get(k, 0) for k in after}
        delta.pop("info", None)  # this benchmark's own reads
        busiest = max(delta.items(), key=lambda kv: kv[1], default=("-", 0))
        return {
            "names": names,
            "commands_per_s": sum(delta.values()) / took,
            "busiest": f"{busiest[0]} {busiest[1] / took:.1f}/s",
            # round trips that ran a script (their commands inside count above too)
            "scripts_per_s": sum(delta.get(k, 0) for k in ("evalsha", "eval", "fcall")) / took,
            "redis_cpu": 100 * (cpu_after - cpu_before) / took,
            "workers_cpu": 100 * (proc_after - proc_before) / took,
            "threads_rss_mb": _rss_mb(run.workers[1].process.pid),
        }


def add_idle_options(parser: argparse.ArgumentParser, names: list[int]) -> None:
    """The idle measurement's options (``names``: the default numbers of names)."""
    parser.add_argument("--names", type=int, nargs="+", default=names)
    parser.add_argument("--per-name", type=int, default=3, help="tasks per name (< limit 4)")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds before measuring")
    parser.add_argument("--idle", type=float, default=15.0, help="seconds measured idle")
    parser.add_argument("--bound", type=float, default=300.0, help="most seconds for the tasks")


def check_idle_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not 0 < args.idle <= 60 or not 0 < args.per_name < 4 or not 0 < args.bound <= 3600:
        parser.error("--idle must be in (0, 60], --per-name in 1-3, --bound in (0, 3600]")


def idle_table(rows: list[dict[str, Any]], args: argparse.Namespace, vs: bool = False) -> str:
    """The rows as a Markdown table, after a line saying what was measured; with ``vs``, each
    figure's ratio to the first row's too."""

    def cell(r: dict[str, Any], key: str, fmt: str) -> str:
        text = fmt.format(r[key])
        if vs and rows[0][key] > 0:
            text += f" ({r[key] / rows[0][key]:.2f}x)"
        return text

    lines = [
        f"idle {args.idle:.0f} s after {args.per_name} tasks of 10 ms per name; prefork -c 4 "
        "and threads -c 8; our clients' commands only (a Redis of their own)",
        "",
        "| names used | commands/s while idle | scripts/s | busiest | Redis CPU | workers' CPU "
        "| threads worker RSS |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['names']:,} | {cell(r, 'commands_per_s', '{:.1f}')} "
            f"| {r['scripts_per_s']:.1f} | {r['busiest']} "
            f"| {cell(r, 'redis_cpu', '{:.1f} %')} | {cell(r, 'workers_cpu', '{:.1f} %')} "
            f"| {cell(r, 'threads_rss_mb', '{:.0f} MB')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_idle_options(parser, [0, 100, 1000])
    parser.add_argument("--label", default=str(ROOT), help="what the table is of")
    args = parser.parse_args()
    check_idle_options(parser, args)
    with servers() as (broker, sems):
        rows = [run_one(n, args, broker, sems) for n in args.names]
    import celery_semaphore

    print(f"\n{args.label} (package: {Path(celery_semaphore.__file__).parent})")
    print(idle_table(rows, args))


if __name__ == "__main__":
    main()
