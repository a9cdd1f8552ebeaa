"""Whole worker nodes fail under load: SIGKILL of a node's process group (its permits come back
with the lease, 3 s here), warm shutdown (SIGTERM) and cold shutdown (SIGQUIT) while limited
tasks run and wait.  The tasks are acks_late, so a message the dead node had taken is delivered
again (the Redis broker's visibility_timeout is 4 s here) and nothing is lost.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix
from tests.integration.workers import Worker, start_worker, start_workers, wait_until

from .harness import Chaos, Settled, measure

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

LEASE = 3.0
#: a database of its own: kombu's Redis transport keeps one index of unacknowledged messages
#: per database, and a worker with a short visibility_timeout restores every message in it
#: that is older than that, other tests' (on other queues) included
DB = 7
VT = 4


@pytest.fixture
def make(redis_server: RedisServer) -> Iterator[Callable[..., Chaos]]:
    """``make(visibility_timeout, restore_every=None)``: a Chaos on the session's Redis (broker,
    store, results); ``restore_every``: seconds between the Redis broker's looks for messages
    to restore (kombu's default: 100)."""
    made: list[Chaos] = []

    def _make(vt: int, restore_every: int | None = None) -> Chaos:
        url = redis_server.url(DB)
        options: dict[str, int] = {"visibility_timeout": vt}
        if restore_every is not None:
            # unacked_mutex_expire: a node SIGKILLed while it restores holds kombu's restore lock
            # until it expires (300 s by default: every unacknowledged message then waits that
            # long, whatever we do); a restore takes milliseconds
            options.update(
                unacked_restore_interval=restore_every,
                unacked_restore_throttle=1,
                unacked_mutex_expire=vt,
            )
        extra = {"broker_transport_options": options}
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
    # what a killed node left unacknowledged (its queue is gone): not restored into a later test
    client.delete("unacked", "unacked_index", "unacked_mutex")
    client.close()


@pytest.fixture
def chaos(make: Callable[..., Chaos]) -> Chaos:
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


def _queued(client: redis.Redis, queue: str) -> set[str]:
    """Task ids still waiting in ``queue`` on the Redis broker (its priority lists too)."""
    ids: set[str] = set()
    for key in client.scan_iter(match=f"{queue}*", count=100):
        if client.type(key) == b"list":
            ids.update(json.loads(raw)["headers"]["id"] for raw in client.lrange(key, 0, -1))
    return ids


def _delivered_to_the_dead(chaos: Chaos, alive: Worker) -> tuple[set[str], set[str]]:
    """Task ids the Redis broker handed to the killed node, which the live node's log does
    not say it received, as ``(unacknowledged, lost by the transport)``.  The first (in its
    prefetch, perhaps before its log said so) come back after the visibility_timeout.  The
    second the node had popped from the queue but not yet recorded as unacknowledged: kombu's
    Redis transport pops a message, then records it in a second step (celery/celery#7950),
    so a node killed in between loses the message, whoever's code runs above it; such an id
    is in neither the queue nor the unacknowledged index.  (A message the live node took a
    moment ago is logged within a second: looked at after one.)"""
    time.sleep(1.0)
    client = redis.Redis.from_url(chaos.env.broker_url)
    try:
        unacked = {json.loads(value)[0]["headers"]["id"] for value in client.hvals("unacked")}
        queued = _queued(client, chaos.env.queue)
    finally:
        client.close()
    not_here = set(chaos.results) - _received(alive)
    return (unacked & not_here), (not_here - unacked - queued)


def test_sigkill_whole_node(make: Callable[..., Chaos]) -> None:
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
        unacked, popped = _delivered_to_the_dead(chaos, b)
        popped -= _received(a)
        # at most the one message a's consumer had popped when it died (one BRPOP)
        assert len(popped) <= 1, f"{popped} are neither queued, nor unacked, nor received"
        on_a = _received(a) | unacked | popped
        on_b = [r for tid, r in chaos.results.items() if tid not in on_a]
        assert on_b
        try:
            wait_until(lambda: all(r.ready() for r in on_b), LEASE + 15, what="the line moves")
        except TimeoutError:
            left = {r.id: r.state for r in on_b if not r.ready()}
            said = {
                tid: [ln for n in (a, b) for ln in n.log().splitlines() if tid in ln][-4:]
                for tid in left
            }
            raise AssertionError(f"not done on b: {left}; the logs say {said}") from None
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


def _standing_by(chaos: Chaos, node: Worker) -> int:
    """Tasks in ``node``'s pool slots that hold no unit: sent ahead to stand by (a task granted
    before it went to the pool holds its unit from the grant on)."""
    active = chaos.app.control.inspect(destination=[node.name], timeout=0.5).active() or {}
    holding = {h.owner.get("task_id") for h in chaos.semaphore().holders()}
    return sum(1 for task in active.get(node.name, []) if task["id"] not in holding)


def test_sigkill_main_process_with_standby_loses_nothing(make: Callable[..., Chaos]) -> None:
    """Tasks that are not acks_late, two prefork nodes, standby on (the prefork default): node
    a's main process is SIGKILLed while a task stands by in one of its slots (then the rest of
    its process group, as the OOM killer or a pod's end would).  Every task whose body never
    started comes back (the Redis broker restores a's unacknowledged messages after its
    visibility_timeout) and runs on b.  Before, Celery acknowledged a task sent ahead to stand
    by as its slot accepted it, without a permit: such tasks were lost, 2 in each of 3 runs."""
    chaos = make(VT, restore_every=1)
    a, b = start_workers(
        chaos.env, {"concurrency": 4, "name": "a"}, {"concurrency": 4, "name": "b"}
    )
    try:
        chaos.load(40, 0.3)
        wait_until(lambda: _standing_by(chaos, a) >= 1, 30, interval=0.05, what="a standby on a")
        os.kill(a.process.pid, signal.SIGKILL)
        a.signal(signal.SIGKILL)

        # a task that held a permit may be lost (below): once only such tasks are left, waiting
        # longer than a restored message needs to run (VT + LEASE) changes nothing
        def ran_or_held() -> set[str]:
            ledger = chaos.rec.ledger()
            return {e.task_id for e in ledger if e.event == "start"} | chaos.watch.ever_held

        settled = Settled(ran_or_held, quiet=VT + LEASE)
        report = chaos.check(results_within=VT + LEASE + 40, may_be_lost=settled)
        started = {e.task_id for e in report.ledger if e.event == "start"}
        # a task that held a permit was acknowledged as its slot accepted it to run: killed with
        # its node before or during its body, it is Celery's at-most-once for early acks (a
        # plain task is lost the same way); a task that never held one must not be lost (the
        # whole node dies, so a grant stays visible until its lease ends: the watch sees it)
        ran = started | chaos.watch.ever_held
        never_ran = [tid for tid in report.lost if tid not in ran]
        # a message a's consumer had popped but the transport had not yet recorded as
        # unacknowledged when a died (celery/celery#7950, as in test_sigkill_whole_node) is lost
        # before any of our code sees it: no node's log names it; at most one (one BRPOP)
        seen = _received(a) | _received(b)
        unseen = [tid for tid in never_ran if tid not in seen]
        assert len(unseen) <= 1, f"{unseen} lost, never received by any node"
        never_ran = [tid for tid in never_ran if tid in seen]
        if never_ran:  # what the logs say of them, for the failure's message
            said = [
                line
                for node in (a, b)
                for line in node.log().splitlines()
                if any(t in line for t in never_ran)
            ]
            (chaos.dir / "a.log").write_text(a.log())
        assert never_ran == [], f"lost without a permit: {never_ran}: {said[-12:]}"
        assert report.counts.max <= chaos.limit
        assert not report.duplicates
    finally:
        for node in (a, b):
            node.stop(timeout=5)
