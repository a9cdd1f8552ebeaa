"""One run at a time per key, after a crash: celery-semaphore against celery-once.

The use case celery-once serves: at most one ``report(user_id)`` at a time, duplicates
dropped.  With celery-semaphore that is ``@limited("report:{user_id}", limit=1,
max_waiting=0, on_full="drop")``; with celery-once, ``base=QueueOnce`` keyed on ``user_id``.
Each run starts two prefork nodes (-c 2), sends one long ``report`` for a new user and, once its
body runs, SIGKILLs either the pool child running it (``child``) or its whole node's process
group (``node``: what the OOM killer or a pod's end does).  Then it sends the same user's report
every 0.2 s and measures how long after the kill a body runs again: the time the key stays
locked by a task that no longer runs.

Our ``lease_ttl`` and celery-once's ``default_timeout`` are set alike (``ONCE_LEASE``,
``ONCE_TIMEOUT``: 10 s), so the table shows the designs, not two defaults (ours: a 60 s lease;
celery-once's: 3600 s).  A run gives up after ``--bound`` seconds and prints ``> bound``.
celery-once is not a dependency of this package: ``pip install celery_once`` to run its rows.

    .venv/bin/python benchmarks/once_killed.py                      # both tools, both kills
    .venv/bin/python benchmarks/once_killed.py --runs 1 --kinds child
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import time
import uuid
from pathlib import Path

import redis
from celery import Celery

from celery_semaphore import limited

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BROKER = os.environ.get("ONCE_BROKER", "redis://127.0.0.1:6379/0")
PREFIX = os.environ.get("ONCE_PREFIX", "one-at-a-time")
#: celery-once's lock timeout and our lease: the same, so that only the designs differ
ONCE_TIMEOUT = int(os.environ.get("ONCE_TIMEOUT", "10"))
LEASE = float(os.environ.get("ONCE_LEASE", "10"))

app = Celery("once_killed", broker=BROKER, backend=BROKER)
app.conf.update(
    semaphore_key_prefix=PREFIX,
    task_default_queue=f"{PREFIX}-q",
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    ONCE={
        "backend": "celery_once.backends.Redis",
        "settings": {"url": BROKER, "default_timeout": ONCE_TIMEOUT},
    },
)


def _started(user_id: str) -> None:
    client = redis.Redis.from_url(BROKER)
    client.rpush(f"{PREFIX}:started:{user_id}", json.dumps([time.time(), os.getpid()]))
    client.close()


@app.task(name="once.ours")  # type: ignore[untyped-decorator]
@limited("report:{user_id}", limit=1, max_waiting=0, on_full="drop", lease_ttl=LEASE)
def ours(user_id: str, seconds: float) -> None:
    _started(user_id)
    time.sleep(seconds)


try:
    from celery_once import AlreadyQueued, QueueOnce
except ImportError:  # optional: its rows are skipped, saying why
    QueueOnce = AlreadyQueued = None
else:

    @app.task(  # type: ignore[untyped-decorator]
        name="once.theirs", base=QueueOnce, once={"keys": ["user_id"]}
    )
    def theirs(user_id: str, seconds: float) -> None:
        _started(user_id)
        time.sleep(seconds)


def _starts(client: redis.Redis, user: str) -> list[tuple[float, int]]:
    """(time, pid) of each body of ``user``'s report that started."""
    rows = client.lrange(f"{PREFIX}:started:{user}", 0, -1)
    return [(float(t), int(pid)) for t, pid in map(json.loads, rows)]


def _send(tool: str, user: str, seconds: float) -> None:
    if tool == "ours":
        app.send_task("once.ours", (user, seconds))
        return
    with contextlib.suppress(AlreadyQueued):  # the key is still locked: what the user sees
        app.tasks["once.theirs"].apply_async((user, seconds))


def run_once(tool: str, kind: str, args: argparse.Namespace) -> float | None:
    """Seconds from the kill until a body runs again (None: not within ``--bound``)."""
    from tests.integration.workers import Env, start_workers, wait_until

    env = Env(
        redis_url=BROKER,
        broker_url=BROKER,
        prefix=PREFIX,
        app_module="benchmarks.once_killed",
        more_env={
            "ONCE_BROKER": BROKER,
            "ONCE_PREFIX": PREFIX,
            "ONCE_TIMEOUT": str(ONCE_TIMEOUT),
            "ONCE_LEASE": str(LEASE),
        },
    )
    client = redis.Redis.from_url(BROKER)
    user = uuid.uuid4().hex[:8]
    nodes = start_workers(env, {"concurrency": 2, "name": "a"}, {"concurrency": 2, "name": "b"})
    try:
        _send(tool, user, 600.0)
        wait_until(lambda: _starts(client, user), 60, interval=0.05, what="the long body")
        [(_, pid)] = _starts(client, user)
        if kind == "child":
            os.kill(pid, signal.SIGKILL)
        else:
            [node] = [n for n in nodes if pid in n.child_pids()]
            node.signal(signal.SIGKILL)
        killed = time.time()
        while time.time() - killed < args.bound:
            _send(tool, user, 0.05)
            again = [t for t, _ in _starts(client, user) if t > killed]
            if again:
                return min(again) - killed
            time.sleep(0.2)
        return None
    finally:
        for node in nodes:
            node.stop(timeout=5)
        for key in client.scan_iter(match=f"{PREFIX}*", count=1000):
            client.delete(key)
        for key in client.scan_iter(match="qo_*", count=1000):  # celery-once's keys
            client.delete(key)
        client.close()


def _cell(times: list[float | None], bound: float) -> str:
    if any(t is None for t in times):
        return f"> {bound:.0f} s ({sum(t is None for t in times)} of {len(times)} runs)"
    done = [t for t in times if t is not None]
    return f"{statistics.median(done):.2f} s (runs: {', '.join(f'{t:.2f}' for t in done)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    both_kinds, both_tools = ["child", "node"], ["ours", "theirs"]
    parser.add_argument("--kinds", nargs="+", choices=both_kinds, default=both_kinds)
    parser.add_argument("--tools", nargs="+", choices=both_tools, default=both_tools)
    parser.add_argument("--bound", type=float, default=90.0, help="most seconds a run waits")
    args = parser.parse_args()
    if not 1 <= args.runs <= 10 or not 1 <= args.bound <= 600:
        parser.error("--runs must be 1-10 and --bound 1-600 seconds")
    if "theirs" in args.tools and QueueOnce is None:
        parser.error("celery-once is not installed: pip install celery_once (or --tools ours)")
    rows: dict[tuple[str, str], list[float | None]] = {}
    for _ in range(args.runs):  # alternated, so both tools see the same machine
        for kind in args.kinds:
            for tool in args.tools:
                rows.setdefault((tool, kind), []).append(run_once(tool, kind, args))
    names = {
        "ours": f'celery-semaphore: limit=1, max_waiting=0, on_full="drop" (lease_ttl {LEASE:g} s)',
        "theirs": f"celery-once: QueueOnce (default_timeout {ONCE_TIMEOUT} s)",
    }
    print(f"\nafter a SIGKILL, seconds until the same key runs again; medians of {args.runs}\n")
    print("| tool | " + " | ".join(f"{k} killed" for k in args.kinds) + " |")
    print("|---|" + "---|" * len(args.kinds))
    for tool in args.tools:
        cells = [_cell(rows[(tool, kind)], args.bound) for kind in args.kinds]
        print(f"| {names[tool]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
