"""A node cut from the semaphores' Redis for 10 s, then back: when do its units reach the
other node, and how long are both nodes' bodies inside together?

Limit 4, lease 60 s (the default), two prefork nodes (-c 4), each consuming its own queue.
Node b reaches the semaphores' Redis through a TCP proxy (``tests/chaos/proxy.py``), node a
directly; the broker and the results stay reachable for both.  b runs 4 long bodies (all the
units; each calls ``checkpoint()`` every 0.05 s, with ``semaphore_on_lease_lost="raise"``),
a has 4 tasks of 45 s waiting (longer than any window); then the proxy refuses b for 10 s
and lets it back.  Timed from the independent ledger of the bodies (``tests/chaos/record.py``),
never from the semaphore:

* **units to a**: seconds from the cut until a's 4 bodies have all started;
* **b told**: seconds from b's return until its last body ended with ``LeaseLost`` (its next
  lease refresh found the permit gone; refreshes come every ``lease_ttl / 3``, 20 s);
* **overlap**: seconds during which more than the limit were inside (a's bodies beside b's
  stale ones), and the most inside at once not counting b's stale bodies.

Each run is made with the liveness record on (``semaphore_liveness_ttl``, default 3 s) and off
(``0``: the lease alone, 60 s, which outlives a 10 s cut: b keeps its units and a's tasks
wait for b's bodies to end), in the same invocation; the medians are printed as one table.
When b is told depends on where the cut falls between its refreshes (here about 9 s after
it is back; at most ``lease_ttl / 3``).

    .venv/bin/python benchmarks/partition.py --redis redis://127.0.0.1:6379/11 --runs 3

Every wait is bounded; only the workers and the proxy started here are stopped, and the keys
and queues of each run deleted.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from celery_semaphore.ops.testing import delete_prefix
from tests.chaos.harness import Chaos, overlap
from tests.chaos.proxy import Proxy
from tests.integration.workers import Worker, start_worker, stop_workers, wait_ready, wait_until

LIMIT = 4
LEASE = 60.0
#: b's bodies, and a's: a's outlast the window, so the ledger sees all of it
BODY = 40.0
TAKER = 45.0


def one_run(url: str, liveness_ttl: float | None, cut_for: float) -> dict[str, Any]:
    """One cut of node b; the figures named in the module's docstring."""
    port = urlparse(url).port or 6379
    proxy = Proxy(port, urlparse(url).hostname or "127.0.0.1")
    settings: dict[str, Any] = {"semaphore_on_lease_lost": "raise"}
    if liveness_ttl is None:
        settings["semaphore_liveness_ttl"] = 0
    chaos = Chaos(
        sem_url=url, broker_url=url, backend_url=url, limit=LIMIT, lease=LEASE, extra=settings
    )
    db = urlparse(url).path.lstrip("/") or "0"
    env_b = dataclasses.replace(chaos.env, redis_url=proxy.url(int(db)))
    nodes: list[Worker] = []
    try:
        for env, name in ((chaos.env, "a"), (env_b, "b")):
            queues = [f"{chaos.env.queue}-{name}"]
            nodes.append(start_worker(env, concurrency=LIMIT, name=name, queues=queues, wait=False))
        wait_ready(chaos.env, nodes[0], 60)
        wait_ready(env_b, nodes[1], 60)

        def send(node: str, mode: str, seconds: float) -> list[str]:
            queue = f"{chaos.env.queue}-{node}"
            return [chaos.send(mode, seconds, queue=queue).id for _ in range(LIMIT)]

        def entries(event: str, ids: list[str]) -> list[Any]:
            return [e for e in chaos.rec.ledger() if e.event == event and e.task_id in ids]

        stale = send("b", "watch", BODY)
        wait_until(lambda: len(entries("start", stale)) == LIMIT, 60, what="b holds all units")
        takers = send("a", "ok", TAKER)
        time.sleep(1.0)  # a's tasks are waiting
        cut = time.time()
        proxy.set_mode("refuse")
        time.sleep(cut_for)  # the cut itself
        proxy.set_mode("pass")
        back = time.time()
        report = chaos.check(results_within=BODY + TAKER + LEASE + 60, holders_within=LEASE + 5)
        a_starts = [e.at for e in entries("start", takers)]
        b_ends = entries("end", stale)
        told = [e.at for e in b_ends if e.extra and e.extra[0] == "LeaseLost"]
        window, _, _, worst = overlap(report.ledger, LIMIT, set(stale))
        return {
            "units_to_a": max(a_starts) - cut if len(a_starts) == LIMIT else float("nan"),
            "b_told": max(told) - back if len(told) == LIMIT else float("nan"),
            "overlap": window,
            "worst_fresh": worst,
            "max_counted": chaos.watch.max_used,
            "lost": len(report.lost),
        }
    finally:
        proxy.set_mode("pass")
        stop_workers(nodes, timeout=10)
        proxy.close()
        chaos.close()
        client = redis.Redis.from_url(url)
        delete_prefix(client, chaos.env.prefix)
        client.delete(chaos.env.queue, f"{chaos.env.queue}-a", f"{chaos.env.queue}-b")
        client.close()


def _median(values: list[float]) -> str:
    real = [v for v in values if v == v]  # NaN: never happened in that run
    if not real:
        return "never"
    return f"{statistics.median(real):.1f}" + ("" if len(real) == len(values) else "*")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/11")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cut", type=float, default=10.0, help="seconds node b is cut off")
    args = parser.parse_args()
    rows = {}
    for label, ttl in (("liveness on (ttl 3 s)", 3.0), ("liveness off (lease 60 s)", None)):
        runs = [one_run(args.redis, ttl, args.cut) for _ in range(args.runs)]
        rows[label] = runs
        print(f"{label}: {runs}", file=sys.stderr)
    print(
        f"\nnode b cut from Redis for {args.cut:.0f} s holding all {LIMIT} units, "
        f"medians of {args.runs} (seconds)\n"
    )
    print(
        "| | units to node a, after the cut | b's bodies told, after it is back "
        "| overlap window (> limit inside) | most inside besides b's stale bodies "
        "| most units the semaphore counted | lost tasks |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, runs in rows.items():
        print(
            f"| {label} | {_median([r['units_to_a'] for r in runs])} "
            f"| {_median([r['b_told'] for r in runs])} "
            f"| {statistics.median(r['overlap'] for r in runs):.1f} "
            f"| {max(r['worst_fresh'] for r in runs)} "
            f"| {max(r['max_counted'] for r in runs)} "
            f"| {sum(r['lost'] for r in runs)} |"
        )
    print("\n(a figure marked * is the median of the runs in which it happened)")


if __name__ == "__main__":
    main()
