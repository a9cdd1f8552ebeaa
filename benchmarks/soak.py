"""Soak test: many limited tasks with faults mixed in, on two real prefork worker nodes.

    python benchmarks/soak.py [--quick] [--tasks N] [--limit N] [--concurrency N]

10,000 tasks (``--quick``: 1,000) on the chaos harness's task (``tests/chaos/tasks.py``): most
succeed after a short body; some raise, some call ``self.retry()`` once, some hit their soft
time limit, some SIGKILL their own pool process (``WorkerLostError``), and some acks_late +
reject_on_worker_lost tasks SIGKILL their process on the first delivery and complete on the
redelivery.  Printed at the end:

* leaks: semaphore holders left a lease after the last task finished;
* over-limit events: body starts that made more than ``limit`` bodies inside at once, by the
  independent file counter (and the most seen at once), and bodies of one task inside twice;
* lost tasks (no final state in time), unexpected final states, duplicates (a task whose body
  completed more than once);
* worker RSS growth: each node's main process, and the node in all (main + pool children),
  from after a warm-up to the end (target: < 20 MB).

Redis: :func:`celery_semaphore.ops.testing.redis_server` (the server named by
``$CELERY_SEMAPHORE_TEST_REDIS_URL``, else ``redis://127.0.0.1:6379`` when reachable, else a
throwaway ``redis-server``): broker, result backend and semaphores, in database ``--db`` (8):
kombu's Redis transport keeps one index of unacknowledged messages per database, and a worker
of another app there with a short ``visibility_timeout`` would hand this run's held messages
out again (seen: 1,409 tasks ran twice, minutes apart, while other tests ran on database 0).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from celery_semaphore.ops.testing import redis_server  # noqa: E402
from tests.chaos.harness import Chaos  # noqa: E402
from tests.conftest import delete_prefix  # noqa: E402
from tests.integration.workers import Worker, start_workers, stop_workers  # noqa: E402

#: (mode, share, expected final states, send options)
MIX: list[tuple[str, float, tuple[str, ...], dict[str, Any]]] = [
    ("ok", 0.80, ("SUCCESS",), {}),
    ("raise", 0.06, ("FAILURE:ValueError",), {}),
    ("retry", 0.05, ("SUCCESS",), {}),
    ("soft", 0.04, ("SUCCESS",), {"soft_time_limit": 0.2}),
    ("kill", 0.02, ("FAILURE:WorkerLostError",), {}),
    ("kill_once", 0.03, ("SUCCESS",), {"late": True}),
]


def rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def node_rss(node: Worker) -> tuple[int, int]:
    """(main process, main + pool children) RSS in kB."""
    main = rss_kb(node.process.pid)
    return main, main + sum(rss_kb(p) for p in node.child_pids())


def final_states(chaos: Chaos, timeout: float) -> tuple[dict[str, str], list[str]]:
    """Task id -> final state (``FAILURE:<exception>`` for failures), read from the result
    backend in batches; and the ids with none after ``timeout`` seconds."""
    client = chaos.env.redis()
    pending = list(chaos.results)
    states: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        still = []
        for i in range(0, len(pending), 500):
            chunk = pending[i : i + 500]
            raws = client.mget([f"celery-task-meta-{t}" for t in chunk])
            for tid, raw in zip(chunk, raws, strict=True):
                meta = json.loads(raw) if raw else {}
                status = meta.get("status")
                if status in ("SUCCESS", "FAILURE", "REVOKED"):
                    if status == "FAILURE":
                        status = f"FAILURE:{(meta.get('result') or {}).get('exc_type')}"
                    states[tid] = status
                else:
                    still.append(tid)
        pending = still
        if pending:
            time.sleep(2.0)
    return states, pending


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    with redis_server() as server:
        url = server.url(args.db)
        chaos = Chaos(sem_url=url, broker_url=url, backend_url=url, limit=args.limit, lease=10.0)
        spec = {"concurrency": args.concurrency}
        nodes = start_workers(chaos.env, {**spec, "name": "soak-a"}, {**spec, "name": "soak-b"})
        try:
            for _ in range(20):  # warm-up: every child imports and connects once
                chaos.send("ok", 0.01)
            final_states(chaos, 120)
            chaos.reset()
            rss_before = [node_rss(n) for n in nodes]
            started = time.monotonic()
            modes = [m for m, _, _, _ in MIX]
            weights = [w for _, w, _, _ in MIX]
            table = {m: (e, o) for m, _, e, o in MIX}
            sent: Counter[str] = Counter()
            for _ in range(args.tasks):
                mode = rng.choices(modes, weights)[0]
                expect, options = table[mode]
                late = bool(options.get("late"))
                extra = {k: v for k, v in options.items() if k != "late"}
                chaos.send(mode, rng.uniform(0.005, 0.03), expect=expect, late=late, **extra)
                sent[mode] += 1
            states, lost = final_states(chaos, args.timeout)
            elapsed = time.monotonic() - started
            holders_gone = -1.0
            sem = chaos.semaphore()
            t0 = time.monotonic()
            while time.monotonic() - t0 < chaos.lease + 2:
                if not sem.holders():
                    holders_gone = time.monotonic() - t0
                    break
                time.sleep(0.1)
            holders = sem.holders()
            rss_after = [node_rss(n) for n in nodes]
            counts = chaos.rec.read()
            ledger = chaos.rec.ledger()
            done = Counter(
                e.task_id for e in ledger if e.event == "end" and e.extra[:1] in (["ok"], ["soft"])
            )
            duplicates = [t for t, n in done.items() if n > 1]
            unexpected = {t: s for t, s in states.items() if s not in chaos.expect[t]}
            by_state = Counter(states.values())
        finally:
            stop_workers(nodes)
            chaos.close()
            client = server.client(args.db)
            for tid in chaos.results:
                client.delete(f"celery-task-meta-{tid}")
            delete_prefix(client, chaos.env.prefix)
            client.delete(chaos.env.queue)
            client.close()
    print(f"soak: {args.tasks} tasks, limit {args.limit}, 2 prefork nodes x {args.concurrency}")
    print(f"  sent by mode        {dict(sent)}")
    print(f"  final states        {dict(by_state)}")
    print(f"  elapsed             {elapsed:.1f} s ({args.tasks / elapsed:.0f} tasks/s)")
    rows = [
        ("leaks (holders a lease after)", len(holders)),
        ("over-limit events (counter)", counts.over),
        ("most bodies inside at once", counts.max),
        ("one task inside twice at once", counts.double),
        ("lost tasks (no final state)", len(lost)),
        ("unexpected final states", len(unexpected)),
        ("duplicates (completed twice)", len(duplicates)),
    ]
    for name, value in rows:
        print(f"  {name:<32} {value}")
    print(f"  holders gone after last task  {holders_gone:.2f} s")
    worst = 0.0
    for node, (m0, t0_), (m1, t1) in zip(nodes, rss_before, rss_after, strict=True):
        grow_main, grow_total = (m1 - m0) / 1024, (t1 - t0_) / 1024
        worst = max(worst, grow_main)
        print(
            f"  RSS {node.name.split('@')[0]:<14} main {m0 / 1024:.1f} -> {m1 / 1024:.1f} MB "
            f"({grow_main:+.1f}); with children {t0_ / 1024:.1f} -> {t1 / 1024:.1f} MB "
            f"({grow_total:+.1f})"
        )
    if unexpected:
        print(f"  unexpected: {dict(list(unexpected.items())[:5])}")
    if lost:
        print(f"  lost: {lost[:5]}")
    bad = (
        holders
        or counts.over
        or counts.max > args.limit
        or counts.double
        or lost
        or unexpected
        or duplicates
        or worst >= 20
    )
    print("  result             ", "FAIL" if bad else "OK")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 tasks instead of 10,000")
    parser.add_argument("--tasks", type=int, default=None)
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for results")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--db",
        type=int,
        default=8,
        help="Redis database (default 8): kombu keeps one index of unacknowledged messages per "
        "database, and workers of other apps with a short visibility_timeout on the same "
        "database would redeliver this run's held messages",
    )
    args = parser.parse_args(argv)
    if args.tasks is None:
        args.tasks = 1_000 if args.quick else 10_000
    for name in ("tasks", "limit", "concurrency"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)}: use an integer >= 1")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
