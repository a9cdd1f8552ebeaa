"""How long ``celery semaphore list`` and the web page's list take with many names (issue 31).

Starts a Redis server of its own, registers N dynamic names (``tenant:{tenant}``, as workers
do when tasks use them) and gives each a state in Redis (one acquire and release), then times
the first page of ``celery semaphore list`` (through click, in this process: no interpreter
start-up), with and without the SCAN for names, and the web page's ``/api/semaphores`` (a fresh
board: the names are read, then the page).  Prints one table; each figure is the best of
``--repeat`` runs.  Bounded: N is at most 50,000, and only the server started here is stopped.

    .venv/bin/python benchmarks/list_pages.py               # 10,000 names
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

import celery_semaphore
from celery_semaphore import Semaphore
from celery_semaphore.ops import registry, web_board
from celery_semaphore.ops.cli import semaphore
from celery_semaphore.ops.testing import start_redis_server

PREFIX = "list-pages"


def best(repeat: int, call: Callable[[], Any]) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--names", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    if not 0 < args.names <= 50_000:
        parser.error("--names must be in 1..50000")
    server = start_redis_server()
    try:
        client = server.client(0)
        names = [f"tenant:{n:05d}" for n in range(args.names)]
        uses = [registry.TaskUse(n, "bench.tenant", 2, template="tenant:{tenant}") for n in names]
        for start in range(0, len(uses), 1000):
            registry.record(client, PREFIX, uses[start : start + 1000], node="bench@host")
        for name in names:
            sem = Semaphore(name, 2, redis=client, key_prefix=PREFIX)
            permit = sem.acquire(blocking=False)
            assert permit is not None
            permit.release()
        app = Celery("list-pages", set_as_current=False)
        app.conf.update(semaphore_redis_url=server.url(0), semaphore_key_prefix=PREFIX)

        def cli(*argv: str) -> Callable[[], Any]:
            def run() -> None:
                obj = CLIContext(app=app, no_color=True, workdir=None)
                result = CliRunner().invoke(semaphore, ["list", *argv], obj=obj)
                assert result.exit_code == 0, result.output

            return run

        def page() -> None:
            board = web_board.Board(app, scan=True, client=client)
            if hasattr(board, "overview_page"):
                board.overview_page()
            else:  # a version without pages lists every semaphore
                board.overview()

        rows = [
            ("celery semaphore list", best(args.repeat, cli())),
            ("celery semaphore list --no-scan", best(args.repeat, cli("--no-scan"))),
            ("web page: /api/semaphores (fresh)", best(args.repeat, page)),
        ]
    finally:
        server.stop()
    print(f"\n{args.label} (package: {Path(celery_semaphore.__file__).parent})")
    print(
        f"{args.names:,} names, each registered and with a state in Redis; best of {args.repeat}\n"
    )
    print("| what | seconds |")
    print("|---|---|")
    for what, seconds in rows:
        print(f"| {what} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
