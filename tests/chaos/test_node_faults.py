"""Whole worker nodes fail under load: SIGKILL of a node's process group (its permits come back
with the lease, 3 s here), warm shutdown (SIGTERM) and cold shutdown (SIGQUIT) while limited
tasks run and wait.  The tasks are acks_late, so a message the dead node had taken is delivered
again (the Redis broker's visibility_timeout is 4 s here) and nothing is lost.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_semaphore.testing import RedisServer
from tests.conftest import delete_prefix
from tests.integration.workers import Worker, start_worker, start_workers, wait_until

from .harness import Chaos, measure

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

LEASE = 3.0
VT = 4


@pytest.fixture
def chaos(redis_server: RedisServer) -> Iterator[Chaos]:
    url = redis_server.url(0)
    c = Chaos(
        sem_url=url,
        broker_url=url,
        backend_url=url,
        limit=2,
        lease=LEASE,
        extra={"broker_transport_options": {"visibility_timeout": VT}},
    )
    yield c
    c.close()
    client = redis_server.client(0)
    delete_prefix(client, c.env.prefix)
    client.delete(c.env.queue)
    client.close()


def _held_on(chaos: Chaos, node: Worker) -> bool:
    return any(h.owner.get("host") == node.name for h in chaos.semaphore().holders())


def _runs_on(chaos: Chaos, node: Worker) -> bool:
    children = set(node.child_pids())
    return any(e.pid in children for e in chaos.running())


def test_sigkill_whole_node(chaos: Chaos) -> None:
    a, b = start_workers(
        chaos.env, {"concurrency": 2, "name": "a"}, {"concurrency": 2, "name": "b"}
    )
    try:
        for _ in range(16):
            chaos.send("ok", 0.5, late=True)
        wait_until(
            lambda: _runs_on(chaos, a) and _held_on(chaos, a), 60, what="a body runs on node a"
        )
        a.signal(signal.SIGKILL)
        killed = time.monotonic()
        wait_until(lambda: not _held_on(chaos, a), LEASE + 5, interval=0.05, what="a's permits")
        took = measure(
            "SIGKILL whole node (lease 3 s)", "its permits back", time.monotonic() - killed
        )
        assert took <= LEASE + 1.5
        report = chaos.assert_promise([a, b], results_within=120)
        assert report.states["SUCCESS"] == 16
    finally:
        a.stop(timeout=5)
        b.stop()


def test_warm_then_cold_shutdown_under_load(chaos: Chaos) -> None:
    a, b = start_workers(
        chaos.env, {"concurrency": 2, "name": "a"}, {"concurrency": 2, "name": "b"}
    )
    c = None
    try:
        for _ in range(12):
            chaos.send("ok", 0.6, late=True)
        wait_until(lambda: _runs_on(chaos, a), 60, what="a body runs on node a")
        t0 = time.monotonic()
        os.kill(a.process.pid, signal.SIGTERM)  # warm: the running bodies finish, the rest go back
        a.process.wait(timeout=30)
        measure("warm shutdown", "node exited (bodies of 0.6 s finish)", time.monotonic() - t0)
        left = [h for h in chaos.semaphore().holders() if h.owner.get("host") == a.name]
        Path("/tmp/warm.log").write_text(a.log())
        assert not left, f"{left}"

        c = start_worker(chaos.env, concurrency=2, name="c")
        for _ in range(12):
            chaos.send("ok", 2.0, late=True)
        wait_until(
            lambda: _runs_on(chaos, c) and _held_on(chaos, c), 60, what="a body runs on node c"
        )
        t0 = time.monotonic()
        os.kill(
            c.process.pid, signal.SIGQUIT
        )  # cold: running bodies are cut short, their permits released
        wait_until(lambda: not _held_on(chaos, c), LEASE + 5, interval=0.02, what="c's permits")
        measure("cold shutdown (SIGQUIT)", "its permits back", time.monotonic() - t0)
        c.process.wait(timeout=30)
        report = chaos.assert_promise([a, b, c], results_within=120)
        assert report.states["SUCCESS"] == 24
    finally:
        for node in (a, b, c):
            if node is not None:
                node.stop(timeout=5)


def test_cold_shutdown_of_an_acks_late_task_runs_it_again(chaos: Chaos) -> None:
    """Cold shutdown cuts an acks_late body short: its message comes back and must run.
    (The cut-short body used to leave a tombstone, so the redelivery was dropped as a
    duplicate of a finished task: lost.)"""
    a = start_worker(chaos.env, concurrency=2, name="a")
    b = None
    try:
        result = chaos.send("ok", 5.0, late=True)
        wait_until(lambda: _runs_on(chaos, a), 60, what="the body runs")
        os.kill(a.process.pid, signal.SIGQUIT)
        a.process.wait(timeout=30)
        b = start_worker(chaos.env, concurrency=2, name="b")
        chaos.assert_promise([a, b], results_within=60)
        assert result.get(timeout=5).startswith("ok")
        starts = [e for e in chaos.rec.ledger() if e.event == "start"]
        assert len(starts) == 2  # cut short once, then run to the end
    finally:
        a.stop(timeout=5)
        if b is not None:
            b.stop()
