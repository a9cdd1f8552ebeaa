"""Handoff latency with the CPUs idle: a chain of short tasks under ``limit=1`` (issue 18).

    python benchmarks/handoff.py [--n 150] [--d 0.005] [--repeats 3] [--redis-url URL]

``benchmarks/e2e.py`` measures handoffs while eight 20 ms bodies and a producer keep two CPUs
busy, so every step of a handoff also waits for a CPU.  This script isolates the hops: one
worker node, ``limit=1``, ``n`` bodies of ``d`` seconds sent at once, so exactly one body runs
at a time and each start follows the previous end.  The gap (a start minus the previous end,
both read by the bodies on one host's clock) is what the chain costs per task:

* ``plain -c 1``: plain tasks on a node of one slot, no semaphore: Celery's own gap between
  two tasks of one slot (the baseline: a dedicated queue for a limit of 1);
* ``limited, standby 0``: ``@limited(limit=1)`` on a node with spare slots, the grant going
  through the gate (on prefork: the releasing child, the gate thread and the event loop of the
  main process, then the pool's start of the job in a child);
* ``limited, standby 2``: the same with ``semaphore_worker_standby=2``: the next tasks wait in
  free slots and the release grants them there.

Every run starts fresh workers (``benchmarks/e2e.py``'s), warms them up, and deletes only its
own keys.  Medians over the gaps of all repeats (interleaved), per pool.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import e2e  # benchmarks/e2e.py: this script's directory is sys.path[0]
import e2e_app

SPARE = 4  # slots of the limited node


def designs(pool: str) -> list[e2e.Design]:
    return [
        e2e.Design("plain1", "plain -c 1", e2e_app.PLAIN, "plain", 1, 1, pool),
        e2e.Design(
            "sb0",
            "limited, standby 0",
            e2e_app.LIMITED,
            "limited",
            1,
            SPARE,
            pool,
            (("semaphore_worker_standby", 0),),
        ),
        e2e.Design(
            "sb2",
            "limited, standby 2",
            e2e_app.LIMITED,
            "limited",
            1,
            SPARE,
            pool,
            (("semaphore_worker_standby", 2),),
        ),
    ]


def gaps(run: e2e.Run) -> list[float]:
    """Milliseconds from each body's end to the next body's start."""
    if run.main is None:
        return []
    bodies = sorted(run.main.bodies)
    return [(b[0] - a[1]) * 1000 for a, b in itertools.pairwise(bodies)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--redis-url", help="Redis to use (default: reuse or start one)")
    parser.add_argument("--n", type=int, default=150, help="tasks per run")
    parser.add_argument("--d", type=float, default=0.005, help="body seconds")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pool", choices=("threads", "prefork", "both"), default="both")
    args = parser.parse_args(argv)
    pools = ["prefork", "threads"] if args.pool == "both" else [args.pool]
    load = e2e.Load(args.n, args.d)
    base = f"bench-handoff-{uuid.uuid4().hex[:12]}"
    logroot = Path(tempfile.mkdtemp(prefix="cs-handoff-"))
    cells = [e2e.Cell(d, load) for pool in pools for d in designs(pool)]
    samples: dict[str, list[float]] = {c.name: [] for c in cells}
    cpu: dict[str, list[float]] = {c.name: [] for c in cells}
    stood: dict[str, list[float]] = {c.name: [] for c in cells}
    t0 = time.monotonic()
    with e2e.redis_target(args.redis_url) as (url, origin):
        index = 0
        for rep in range(args.repeats):  # interleaved: drift hits every cell alike
            for cell in cells:
                index += 1
                run = e2e.run_cell(cell, url, url, base, index, logroot, {}, limit=1)
                if run.main is None or not run.main.complete or run.main.max_inside != 1:
                    print(f"  {cell.name}: incomplete or over the limit: {run}", file=sys.stderr)
                    return 1
                samples[cell.name] += gaps(run)
                cpu[cell.name].append(run.cpu / args.n * 1000)
                hows = [b[2] for b in run.main.bodies]
                stood[cell.name].append(hows.count("s") / len(hows))
                print(
                    f"  run {index} (repeat {rep + 1}) {cell.name}: gap p50 "
                    f"{statistics.median(gaps(run)):.2f} ms",
                    file=sys.stderr,
                )
    print(
        f"Handoff chain: limit 1, {load.label()} sent at once to one node (-c {SPARE} for the "
        f"limited rows); {args.repeats} run(s) per row, interleaved; Redis at {origin}."
    )
    print()
    header = ["pool", "case", "gap p50 ms", "p90 ms", "above plain p50", "CPU ms/task", "stood by"]
    rows = []
    for pool in pools:
        plain = e2e.percentile(samples[e2e.Cell(designs(pool)[0], load).name], 50)
        for design in designs(pool):
            name = e2e.Cell(design, load).name
            p50 = e2e.percentile(samples[name], 50)
            rows.append(
                [
                    pool,
                    design.label,
                    f"{p50:.2f}",
                    f"{e2e.percentile(samples[name], 90):.2f}",
                    "-" if design.key == "plain1" else f"{p50 - plain:+.2f}",
                    f"{statistics.median(cpu[name]):.2f}",
                    f"{statistics.median(stood[name]):.0%}",
                ]
            )
    print(e2e.render(header, rows))
    print()
    print(
        "gap: a body's start minus the previous body's end (both on the bodies' clock), pooled "
        "over the runs; CPU ms/task: all worker processes, median of the runs; stood by: the "
        "share of bodies that started from a standby slot."
    )
    print(f"Run time {time.monotonic() - t0:.0f} s; logs in {logroot}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
