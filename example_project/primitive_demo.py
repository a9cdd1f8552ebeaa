"""Standalone demo of the core primitive: 12 threads share a limit of 3.

Run with ``python -m example_project --primitive`` (or ``python -m
example_project.primitive_demo``).  Uses ``$REDIS_URL`` when set, else a reachable local Redis,
else starts a throwaway ``redis-server``.  Prints a live
line per second and a summary showing that no more than ``limit`` workers ever held a permit.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid

from celery_semaphore import Semaphore
from celery_semaphore.ops.testing import fallback_notice, redis_server

LIMIT = 3
WORKERS = 12
DURATION = 5.0


def main() -> None:
    with redis_server(os.environ.get("REDIS_URL")) as server:
        notice = fallback_notice(server, "to use a Redis of your own, set REDIS_URL")
        if notice:
            print(notice)
        prefix = f"demo-{uuid.uuid4().hex[:8]}"
        sem = Semaphore("payment-gateway", LIMIT, redis=server.url(), key_prefix=prefix)
        lock = threading.Lock()
        state = {"inside": 0, "max": 0, "done": 0}
        waits: list[float] = []
        stop = time.monotonic() + DURATION

        def worker() -> None:
            while time.monotonic() < stop:
                started = time.monotonic()
                with sem.hold(timeout=10):
                    with lock:
                        waits.append(time.monotonic() - started)
                        state["inside"] += 1
                        state["max"] = max(state["max"], state["inside"])
                    time.sleep(random.uniform(0.01, 0.05))  # the "API call"
                    with lock:
                        state["inside"] -= 1
                        state["done"] += 1

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(WORKERS)]
        print(
            f"{WORKERS} workers share semaphore 'payment-gateway' (limit {LIMIT}) on {server.url()}"
        )
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            time.sleep(1.0)
            snap = sem.inspect()
            bar = "#" * snap.used + "." * (snap.limit - snap.used)
            print(
                f"  in use [{bar}] {snap.used}/{snap.limit}  waiting {len(snap.waiters):2d}  "
                f"done {state['done']}"
            )
        for t in threads:
            t.join(timeout=15)
        waits.sort()
        p50 = waits[len(waits) // 2] * 1000 if waits else 0.0
        p99 = waits[int(len(waits) * 0.99)] * 1000 if waits else 0.0
        print(
            f"\nsummary: {state['done']} calls, most simultaneous holders {state['max']} "
            f"(limit {LIMIT}), wait p50 {p50:.1f} ms p99 {p99:.1f} ms, "
            f"leaked permits {len(sem.holders())}"
        )
        for key in server.client().scan_iter(match=f"{prefix}:*"):
            server.client().delete(key)
        if state["max"] > LIMIT:
            raise SystemExit("the limit did not hold")


if __name__ == "__main__":
    main()
