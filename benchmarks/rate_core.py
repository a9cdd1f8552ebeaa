"""What a rate costs the core primitive, and why it is a sliding log rather than GCRA.

    python benchmarks/rate_core.py [--redis-url URL] [--pairs N] [--rounds R]

Redis: ``--redis-url`` as given, else ``redis://127.0.0.1:6379/0``.  Every key lives under a
fresh ``bench-<uuid>`` prefix and only those keys are deleted at the end (never FLUSHDB).

Three measurements, printed as tables:

1. Uncontended acquire + release pairs (non-blocking acquire, one connection), without a rate
   and with rates that never bind (so every pair is the same work: one start recorded), with
   one and with two windows.  Rounds are interleaved; the median is shown.  The second window
   of an hour keeps every start of the run in the log, so the log holds up to ``N`` members.
2. Memory of the starts log (``MEMORY USAGE``) after ``N`` starts, per start.
3. Precision: how many starts GCRA (one value per window, burst = N) admits in one sliding
   window of the period, against the sliding log (exactly N), simulated on a busy client
   (an attempt every ``period / (4 N)``).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import redis

from celery_semaphore import Rate, Semaphore


def _pairs_per_second(sem: Semaphore, pairs: int) -> float:
    started = time.perf_counter()
    for _ in range(pairs):
        permit = sem.acquire(blocking=False)
        if permit is None:
            raise RuntimeError(f"{sem!r} refused a start: the rate binds; use fewer pairs")
        permit.release()
    return pairs / (time.perf_counter() - started)


def _gcra_most_in_window(count: int, period: float, attempts: int) -> int:
    """Starts GCRA admits in the busiest window of ``period`` (emission interval period/count,
    tolerance period - interval: bursts of ``count``), with an attempt every period/(4 count)."""
    interval = period / count
    tat = 0.0
    admitted: list[float] = []
    step = period / (4 * count)
    for i in range(attempts):
        now = i * step
        new_tat = max(tat, now) + interval
        if new_tat - period <= now:
            tat = new_tat
            admitted.append(now)
    most, j = 0, 0
    for i, t in enumerate(admitted):
        while admitted[j] <= t - period:
            j += 1
        most = max(most, i - j + 1)
    return most


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    client = redis.Redis.from_url(args.redis_url)
    prefix = f"bench-{uuid.uuid4().hex}"
    big = 10**9
    designs = {
        "no rate": None,
        "1 window (1e9/s)": [Rate(big, 1.0)],
        "2 windows (1e9/s, 1e9/h)": [Rate(big, 1.0), Rate(big, 3600.0)],
    }
    try:
        sems = {
            label: Semaphore(f"bench-{i}", 10, redis=client, key_prefix=prefix, rate=rate)
            for i, (label, rate) in enumerate(designs.items())
        }
        results: dict[str, list[float]] = {label: [] for label in sems}
        for sem in sems.values():
            _pairs_per_second(sem, 50)  # load the scripts, warm the connection
        for _ in range(args.rounds):
            for label, sem in sems.items():
                results[label].append(_pairs_per_second(sem, args.pairs // args.rounds))
        base = statistics.median(results["no rate"])
        print(f"1. acquire + release, {args.pairs} pairs in {args.rounds} interleaved rounds")
        print(f"   {'design':<28}{'pairs/s':>10}{'us/pair':>10}{'vs no rate':>12}")
        for label, values in results.items():
            rate = statistics.median(values)
            print(f"   {label:<28}{rate:>10.0f}{1e6 / rate:>10.1f}{rate / base:>12.2f}")
        two = sems["2 windows (1e9/s, 1e9/h)"]
        members = int(client.zcard(two.keys.starts))
        size = int(client.memory_usage(two.keys.starts) or 0)
        print(f"\n2. starts log after {members} starts kept (a 1-hour window): {size} bytes, ")
        print(f"   {size / max(1, members):.0f} bytes per start kept")
        print("\n3. busiest window of the period (an attempt every period / (4 N)):")
        print(f"   {'N':>6}{'sliding log':>14}{'GCRA':>8}")
        for count in (10, 100, 1000):
            gcra = _gcra_most_in_window(count, 1.0, 40 * count)
            print(f"   {count:>6}{count:>14}{gcra:>8}")
    finally:
        keys = list(client.scan_iter(match=prefix + "*"))
        if keys:
            client.delete(*keys)


if __name__ == "__main__":
    main()
