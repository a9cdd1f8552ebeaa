"""A deep backlog on two nodes: does any unit sit idle while tasks wait?

Limit 2, two prefork nodes (-c 4 each, Redis broker), N tasks of 50 ms sent at once, a short
``semaphore_slot_wait_timeout`` so that standbys give up (and park) often, and a short lease so
that a stall the lease or a place's TTL ends shows up quickly.  Measures, from the chaos
harness's independent ledger (bodies' start/end times, no Redis), the gaps during which no
body was inside while tasks still waited, and greps the workers' logs.

Prints, per run, a dict: tasks done, lost and run twice, the most bodies inside at once, the
makespan beside the ideal one (tasks x 50 ms / limit 2: the baseline no limiter can beat), the
gaps of over 1 s with no body inside, and counts of telling lines in the workers' logs.
Needs the Redis at 127.0.0.1:6379 (database 11).  Every loop is bounded in count and time;
only the workers started here are stopped.

    .venv/bin/python benchmarks/backlog.py --tasks 600 --lease 10 --slot-wait 0.1 \
        --concurrency 4 --hold 20 --runs 1 --bound 200

``--hold 20`` (semaphore_worker_hold) fills both gates early, so most messages stay in the
broker and the nodes stop fetching: a standby that gives up parks a copy behind that backlog
while its place stays in line.  Before the fix (c914fd1): 350 of 600 done in 200 s, gaps
of ~30 s with no body inside (the parked place's TTL: countdown + max(30 s, lease)); with
--lease 60, gaps of 60.7 s and 60.1 s.  With the stand-down fix: 600/600 in 17.8 s, no gap.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.chaos.harness import Chaos
from tests.chaos.record import Entry
from tests.integration.workers import start_workers, stop_workers

URL = "redis://127.0.0.1:6379/11"


def gaps(ledger: list[Entry], first_send: float) -> tuple[list[tuple[float, float]], float]:
    """(start, length) of each interval with no body inside, from the first start to the
    last end, and the makespan (first send to last end)."""
    events = sorted((e.at, 1 if e.event == "start" else -1) for e in ledger)
    inside, idle_from, out = 0, None, []
    for at, d in events:
        if inside == 0 and d == 1 and idle_from is not None:
            out.append((idle_from - first_send, at - idle_from))
        inside += d
        if inside == 0:
            idle_from = at
    last = max(e.at for e in ledger if e.event == "end")
    return out, last - first_send


def run(args: argparse.Namespace) -> dict[str, Any]:
    chaos = Chaos(
        sem_url=URL,
        broker_url=URL,
        backend_url=URL,
        limit=2,
        lease=args.lease,
        extra={
            "semaphore_slot_wait_timeout": args.slot_wait,
            "worker_prefetch_multiplier": 4,
            "semaphore_worker_hold": args.hold,
        },
    )
    nodes = start_workers(
        chaos.env, *({"concurrency": args.concurrency, "name": f"n{i}"} for i in range(2))
    )
    try:
        sent_at = time.time()
        chaos.load(args.tasks, seconds=0.05)
        report = chaos.check(results_within=args.bound)
    finally:
        stop_workers(nodes)
        chaos.close()
    ledger = report.ledger
    starts = Counter(e.task_id for e in ledger if e.event == "start")
    idle, makespan = gaps(ledger, sent_at)
    ideal = args.tasks * 0.05 / 2
    logs = {n.name: n.log() for n in nodes}
    pat = {
        "woken_redispatch": r"woken: re-dispatched the parked task now",
        "parked": r"parked in the broker",
        "duplicate": r"this copy is a duplicate",
        "gave_back": r"gave back a grant made to this task's place",
        "warning": r" WARNING",
        "handoff_pool": r"whose place went to the pool",
        "stood_by_parked": r"standing by|stood by",
    }
    counts = {n: {k: len(re.findall(p, text)) for k, p in pat.items()} for n, text in logs.items()}
    out = {
        "dir": str(chaos.dir),
        "done": sum(1 for t, s in report.states.items() if t == "SUCCESS" for _ in range(s)),
        "states": dict(report.states),
        "lost": len(report.lost),
        "ran_twice": sum(1 for n in starts.values() if n > 1),
        "max_inside": report.counts.max,
        "makespan": round(makespan, 2),
        "ideal": ideal,
        "ratio": round(makespan / ideal, 2),
        "gaps_over_1s": [(round(a, 1), round(b, 2)) for a, b in idle if b > 1.0],
        "logs": counts,
    }
    for name, text in logs.items():
        (chaos.dir / f"{name}.log").write_text(text)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tasks", type=int, default=600)
    p.add_argument("--lease", type=float, default=10.0)
    p.add_argument("--slot-wait", type=float, default=0.1)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--hold", type=int, default=20, help="semaphore_worker_hold")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--bound", type=float, default=180.0, help="seconds to wait for results")
    args = p.parse_args()
    for i in range(min(args.runs, 5)):
        print(f"run {i + 1}:", run(args), flush=True)


if __name__ == "__main__":
    main()
