"""Worker shutdowns under load leave nothing held.

* Warm shutdown (SIGTERM to the main process) while limited tasks run and wait: the running
  bodies finish, the worker exits, nothing is held; a new worker then runs every task that did
  not run, each exactly once.
* Cold shutdown (SIGQUIT to the main process) while a long limited task runs: the body is cut
  short and its permit comes back at once (the child's ``finally``), long before its lease
  would expire.

Each test starts its own worker (shutting down is the point).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix

from . import proj
from .helpers import finished_at, holders, inside, max_inside, ran, semaphore, started_at
from .workers import Env, Worker, start_worker, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def env(redis_server: RedisServer) -> Iterator[Env]:
    url = redis_server.url(0)
    e = Env(redis_url=url, broker_url=url, limit=2)
    yield e
    client = redis_server.client(0)
    delete_prefix(client, e.prefix)
    client.delete(e.queue)
    client.close()


def _exit(worker: Worker, sig: int, timeout: float) -> float:
    """Send ``sig`` to the worker's main process only; return seconds until it exited."""
    sent = time.monotonic()
    os.kill(worker.process.pid, sig)
    try:
        worker.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"the worker did not exit within {timeout}s of {sig!r}:\n{worker.log()[-3000:]}"
        )
    return time.monotonic() - sent


def test_warm_shutdown_under_load(env: Env) -> None:
    """prefork -c 5, limit 2: at the SIGTERM two bodies run, two tasks wait in their slots
    (the head of the line) and the rest have parked (their copies wait with a countdown)."""
    node = start_worker(env, pool="prefork", concurrency=5)
    try:
        app = env.client_app()
        tags = [f"w{i}" for i in range(10)]
        results = [app.send_task(proj.work.name, (t, 1.0)) for t in tags]
        sem = semaphore(env)
        wait_until(lambda: inside(env) == env.limit, 20, what="two bodies running")
        wait_until(lambda: any(w.parked for w in sem.waiters()), 20, what="a task parked")
        _exit(node, signal.SIGTERM, 30)
        assert node.process.returncode == 0
        # nothing held, and every body that started also finished
        assert holders(env) == []
        assert inside(env) == 0
        starts, ends = started_at(env), finished_at(env)
        assert starts
        assert set(starts) == set(ends)
        assert all(ends[t] - starts[t] >= 1.0 for t in starts)
        done = set(starts)
        assert len(ran(env)) == len(done)  # each started once
        assert "permit LOST" not in node.log()
        assert "Traceback" not in node.log()
    finally:
        node.stop()

    # the rest were restored to the queue (or parked): a new worker runs each exactly once
    node = start_worker(env, pool="prefork", concurrency=5)
    try:
        assert sorted(r.get(timeout=60) for r in results) == sorted(tags)
        assert sorted(ran(env)) == sorted(tags)
        assert max_inside(env) == env.limit
        wait_until(lambda: not holders(env), 5, what="no holders after the restart")
    finally:
        node.stop()


@pytest.mark.parametrize("pool", ["prefork", "solo"])
def test_cold_shutdown_releases_a_running_task(env: Env, pool: str) -> None:
    node = start_worker(env, pool=pool, concurrency=2)
    try:
        app = env.client_app()
        result = app.send_task(proj.sleeper.name, ("cold", 60))
        sem = semaphore(env)
        wait_until(lambda: ran(env) == ["cold"], 20, what="the long task's body runs")
        assert any(h.owner.get("task_id") == result.id for h in sem.holders())
        assert holders(env)[0].lease_remaining > 30  # lease 60 s: only a release frees it now
        quit_at = time.monotonic()
        _exit(node, signal.SIGQUIT, 20)
        wait_until(lambda: not holders(env), 5, what="permit released after cold shutdown")
        assert time.monotonic() - quit_at < 10
        assert ran(env) == ["cold"]
        pid = int(env.redis().get(f"{env.prefix}:pid:cold") or 0)
        assert pid
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # the body's process is gone: it did not keep running
    finally:
        node.stop()
