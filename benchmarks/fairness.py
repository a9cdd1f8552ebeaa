"""Fair sharing benchmark: one queue's flood against another queue's steady trickle.

    python benchmarks/fairness.py [--flood N] [--b-rate R] [--b-seconds S] [--redis-url URL]

Two real ``celery worker`` nodes (threads pool, 6 slots each; the integration tests' harness and
app, ``tests/integration``) consume queues A and B; one semaphore, limit 4.  Queue A gets a flood
of short tasks (20 ms), then queue B a steady trickle (100 ms tasks at ``--b-rate`` per second,
below B's fair share of 2 units).  The same load runs twice: on a task partitioned by delivery
queue (fairness on, the default) and on one with ``partition=None`` (one FIFO line, off),
then partitioned by queue again with every task given a priority 0-9 (``priority=`` from its
arguments, spread evenly over both queues): priorities order each queue's own line and must
leave the shares between queues as they were.

One table: B's wait (send to body start) p50 and p95, A's p50, and while B sends (A's flood
waiting all along): each partition's units in use (from the bodies' own start and end times)
and share of the grants, B's use over its max-min fair share (its demand, ``rate x 0.1`` units,
when below half the limit), and Jain's index over the two partitions' use normalized by their
fair shares (1.0: each got its fair share).  Redis: ``--redis-url``, else a reachable local
one, else a throwaway ``redis-server``; only the run's own keys are deleted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from celery_semaphore.ops.testing import redis_server  # noqa: E402
from tests.conftest import delete_prefix  # noqa: E402
from tests.integration import proj, proj_prio  # noqa: E402
from tests.integration.fairness_stats import (  # noqa: E402
    Sample,
    collect,
    jain,
    percentile,
    usage_between,
)
from tests.integration.helpers import ledger, max_inside, reset_bookkeeping  # noqa: E402
from tests.integration.workers import Env, start_workers, stop_workers, wait_until  # noqa: E402

LIMIT = 4


def _args(tag: str, seconds: float, prio: bool) -> tuple[Any, ...]:
    """A task's arguments; with ``prio``, its priority too (0-9, spread over the tags)."""
    return (tag, seconds, int(tag[1:]) * 7 % 10) if prio else (tag, seconds)


def run_load(
    env: Env, task: Any, qa: str, qb: str, args: argparse.Namespace, prio: bool = False
) -> list[Sample]:
    reset_bookkeeping(env)
    env.redis().delete(f"{env.prefix}:grants")
    app = env.client_app()
    sent: dict[str, tuple[str, float]] = {}
    try:
        for i in range(args.flood):
            tag = f"A{i:05d}"
            sent[tag] = (qa, time.time())
            app.send_task(task.name, _args(tag, 0.02, prio), queue=qa)
        began = time.monotonic()
        for i in range(int(args.b_rate * args.b_seconds)):
            time.sleep(max(0.0, began + i / args.b_rate - time.monotonic()))
            tag = f"B{i:05d}"
            sent[tag] = (qb, time.time())
            app.send_task(task.name, _args(tag, 0.1, prio), queue=qb)
    finally:
        app.close()
    wait_until(lambda: len(ledger(env, "finished")) >= 2 * len(sent), 600, 0.2, what="finished")
    return collect(env, sent)


def row(label: str, samples: list[Sample], qa: str, qb: str, b_load: float, peak: int) -> str:
    """One line of the table; shares are measured while B sends (A's flood still waiting)."""
    b_waits = [s.wait for s in samples if s.partition == qb]
    a_waits = [s.wait for s in samples if s.partition == qa]
    b_sent = [s.sent for s in samples if s.partition == qb]
    t0, t1 = min(b_sent), max(b_sent)
    use = usage_between(samples, t0, t1)
    used_a, used_b = use.get(qa, 0.0), use.get(qb, 0.0)
    grants = [s.partition for s in samples if t0 <= s.started <= t1]
    g_a, g_b = grants.count(qa), grants.count(qb)
    # max-min fair allocation: B asks for b_load units (below half the limit), A for the rest
    fair_b = min(b_load, LIMIT / 2)
    fair_a = LIMIT - fair_b
    normalized = [used_a / fair_a, used_b / fair_b]
    p50_b, p95_b = percentile(b_waits, 0.5) * 1000, percentile(b_waits, 0.95) * 1000
    return (
        f"| {label} | {p50_b:.0f} | {p95_b:.0f} | {percentile(a_waits, 0.5) * 1000:.0f} "
        f"| {used_a:.2f} / {used_b:.2f} | {g_a / max(1, g_a + g_b):.2f} / "
        f"{g_b / max(1, g_a + g_b):.2f} | {normalized[1]:.2f} | {jain(normalized):.3f} | {peak} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--flood", type=int, default=1000, help="A's tasks (20 ms each)")
    parser.add_argument("--b-rate", type=float, default=10.0, help="B's tasks per second")
    parser.add_argument("--b-seconds", type=float, default=5.0, help="how long B sends")
    parser.add_argument("--redis-url", help="Redis to use (default: reuse or start one)")
    args = parser.parse_args(argv)
    with redis_server(args.redis_url) as server:
        env = Env(
            redis_url=server.url(0),
            broker_url=server.url(0),
            limit=LIMIT,
            extra={"include": ["tests.integration.proj_prio"]},
        )
        qa, qb = f"{env.prefix}-a", f"{env.prefix}-b"
        spec = {"pool": "threads", "concurrency": 6, "queues": [qa, qb]}
        nodes = start_workers(env, spec, spec)
        try:
            on = run_load(env, proj.fair_work, qa, qb, args)
            on_peak = max_inside(env, "fair")
            off = run_load(env, proj.fifo_work, qa, qb, args)
            off_peak = max_inside(env, "fifo")
            mixed = run_load(env, proj_prio.fair_prio_work, qa, qb, args, prio=True)
            mixed_peak = max_inside(env, "fair-prio")
        finally:
            stop_workers(nodes)
            client = server.client(0)
            delete_prefix(client, env.prefix)
            client.close()
    print(
        f"fairness: A = {args.flood} x 20 ms flood, B = {args.b_rate:g}/s x 100 ms for "
        f"{args.b_seconds:g} s; limit {LIMIT}; 2 nodes x 6 threads; one run each\n"
    )
    print(
        "| partitioning | B wait p50 (ms) | B wait p95 (ms) | A wait p50 (ms) "
        "| units in use A / B | grant share A / B | B served / fair share | Jain | peak in use |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    b_load = args.b_rate * 0.1
    print(row("by queue (on)", on, qa, qb, b_load, on_peak))
    print(row("partition=None (off)", off, qa, qb, b_load, off_peak))
    print(row("by queue, priorities 0-9 mixed", mixed, qa, qb, b_load, mixed_peak))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
