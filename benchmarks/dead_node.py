"""A whole worker node SIGKILLed: how long until the other node's waiting tasks hold its units?

Limit 4, lease 60 s (the default), two prefork nodes (-c 4), each consuming its own queue:
node a runs 4 long bodies (all the units), node b has 4 tasks waiting; then a's whole process
group is SIGKILLed, and the seconds from the kill until b's 4 bodies are all inside are timed
(an independent counter in the bodies, not the semaphore).  Each run is made with the liveness
record on (``semaphore_liveness_ttl``, default 3 s) and off (``0``: the lease), in the same
invocation, and the medians printed as a table.

    .venv/bin/python benchmarks/dead_node.py --redis redis://127.0.0.1:6379/11 --runs 3

Every wait is bounded; only the workers started here are stopped, and the keys and queues of
each run deleted.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from celery_semaphore.ops.testing import delete_prefix
from tests.integration import proj
from tests.integration.helpers import inside
from tests.integration.workers import Env, start_worker, wait_until

LIMIT = 4


def one_run(url: str, liveness_ttl: float | None, bound: float) -> float:
    """Seconds from the kill of node a until node b's 4 tasks are all inside."""
    extra = {} if liveness_ttl is None else {"semaphore_liveness_ttl": liveness_ttl}
    env = Env(redis_url=url, broker_url=url, limit=LIMIT, lease=60.0, extra=extra)
    qa, qb = f"{env.queue}-a", f"{env.queue}-b"
    a = start_worker(env, concurrency=LIMIT, name="a", queues=[qa])
    b = start_worker(env, concurrency=LIMIT, name="b", queues=[qb])
    app = env.client_app()
    client = env.redis()
    try:
        for i in range(LIMIT):
            app.send_task(proj.work.name, (f"a{i}", 300.0), queue=qa)
        wait_until(lambda: inside(env) == LIMIT, 60, what="all units held on node a")
        for i in range(LIMIT):
            app.send_task(proj.work.name, (f"b{i}", 5.0), queue=qb)
        time.sleep(1.0)
        killed = time.monotonic()
        a.signal(signal.SIGKILL)
        a.process.wait(timeout=10)
        client.set(f"{env.prefix}:inside:main", 0)  # a's bodies died inside
        wait_until(lambda: inside(env) == LIMIT, bound, interval=0.01, what="b holds all units")
        return time.monotonic() - killed
    finally:
        for node in (a, b):
            node.stop(timeout=5)
        app.close()
        delete_prefix(client, env.prefix)
        client.delete(env.queue, qa, qb)
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/11")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--bound", type=float, default=120.0)
    args = parser.parse_args()
    results: dict[str, list[float]] = {"liveness on (default, 3 s)": [], "off (lease 60 s)": []}
    for _ in range(args.runs):
        for label, ttl in (("liveness on (default, 3 s)", None), ("off (lease 60 s)", 0.0)):
            took = one_run(args.redis, ttl, args.bound)
            results[label].append(took)
            print(f"{label}: {took:.2f} s", flush=True)
    print("\n| liveness | seconds until the other node holds all 4 units (median) | runs |")
    print("|---|---|---|")
    for label, values in results.items():
        runs = ", ".join(f"{v:.1f}" for v in values)
        print(f"| {label} | {statistics.median(values):.1f} | {runs} |")


if __name__ == "__main__":
    main()
