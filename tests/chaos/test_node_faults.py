"""Whole worker nodes fail under load: SIGKILL of a node's process group (its permits come back
with the lease, 3 s here), warm shutdown (SIGTERM) and cold shutdown (SIGQUIT) while limited
tasks run and wait.  The tasks are acks_late, so a message the dead node had taken is delivered
again (the Redis broker's visibility_timeout is 4 s here) and nothing is lost.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator

import pytest

from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix
from tests.integration.workers import Worker, start_worker, start_workers, wait_until

from .harness import Chaos, measure

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

LEASE = 3.0
#: a database of its own: kombu's Redis transport keeps one index of unacknowledged messages
#: per database, and a worker with a short visibility_timeout restores every message in it
#: that is older than that, other tests' (on other queues) included
DB = 7
VT = 4


@pytest.fixture
def make(redis_server: RedisServer) -> Iterator[Callable[[int], Chaos]]:
    """``make(visibility_timeout)``: a Chaos on the session's Redis (broker, store, results)."""
    made: list[Chaos] = []

    def _make(vt: int) -> Chaos:
        url = redis_server.url(DB)
        extra = {"broker_transport_options": {"visibility_timeout": vt}}
        made.append(
            Chaos(sem_url=url, broker_url=url, backend_url=url, limit=2, lease=LEASE, extra=extra)
        )
        return made[-1]

    yield _make
    client = redis_server.client(DB)
    for c in made:
        c.close()
        delete_prefix(client, c.env.prefix)
        client.delete(c.env.queue)
    client.close()


@pytest.fixture
def chaos(make: Callable[[int], Chaos]) -> Chaos:
    return make(VT)


def _held_on(chaos: Chaos, node: Worker) -> bool:
    return any(h.owner.get("host") == node.name for h in chaos.semaphore().holders())


def _runs_on(chaos: Chaos, node: Worker) -> bool:
    children = set(node.child_pids())
    return any(e.pid in children for e in chaos.running())


def _waiting_on(chaos: Chaos, node: Worker) -> int:
    return sum(1 for w in chaos.semaphore().waiters() if w.owner.get("host") == node.name)


def _received(node: Worker) -> set[str]:
    """Task ids the node's log says it received (ran, held or parked there)."""
    return set(re.findall(r"\[([0-9a-f-]{36})\] received", node.log()))


def test_sigkill_whole_node(make: Callable[[int], Chaos]) -> None:
    """Node a dies with two bodies running and tasks held in its gate at the head of the
    line; node b holds more behind them.  a's permits come back with the lease, and so do its
    held tasks' places in line (before: 60 s whatever the lease, and b's tasks stood still
    behind them).  a's own unacknowledged messages come back when the Redis broker restores
    them, after its visibility_timeout (30 s here, so that the gates hold their tasks, up to
    15 s, rather than park them meanwhile): outside this test's time; they must not have run
    twice."""
    chaos = make(30)
    a = start_worker(chaos.env, concurrency=4, name="a")
    b = None
    try:
        for _ in range(2):
            chaos.send("ok", 10.0, late=True)
        for _ in range(3):
            chaos.send("ok", 0.5, late=True)
        wait_until(lambda: _waiting_on(chaos, a) >= 2, 60, what="a holds tasks")
        b = start_worker(chaos.env, concurrency=2, name="b")
        for _ in range(8):
            chaos.send("ok", 0.5, late=True)
        wait_until(lambda: _waiting_on(chaos, b) >= 1, 60, what="b holds tasks")
        a.signal(signal.SIGKILL)
        killed = time.monotonic()
        wait_until(lambda: not _held_on(chaos, a), LEASE + 5, interval=0.05, what="a's permits")
        took = measure(
            "SIGKILL whole node (lease 3 s)", "its permits back", time.monotonic() - killed
        )
        assert took <= LEASE + 1.5
        on_a = _received(a)
        on_b = [r for tid, r in chaos.results.items() if tid not in on_a]
        assert on_b
        wait_until(lambda: all(r.ready() for r in on_b), LEASE + 15, what="the line moves")
        measure(
            "SIGKILL whole node (lease 3 s)",
            f"{len(on_b)} tasks behind its held ones done (0.5 s each, limit 2)",
            time.monotonic() - killed,
        )
        for tid in on_a:
            chaos.results.pop(tid, None)
        report = chaos.assert_promise([a, b])
        assert report.states["SUCCESS"] == len(on_b)
    finally:
        for node in (a, b):
            if node is not None:
                node.stop(timeout=5)


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
