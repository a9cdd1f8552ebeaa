"""A task the gate sends to its slot after a partial Redis failure is never lost.

The defect: with ``semaphore_worker_hold=1`` a second task held by the gate overflows (it is
not counted in the hold, and is tried again at every tick).  Its retry at the next tick fails
(the gate's script calls are dropped, while another node still reaches Redis), and the gate
sends it to a pool slot, where its wrapper cannot reach Redis either and parks it (a copy comes
back after a countdown).  Its place in line still names the gate's handoff address.  Another
node's release hands the unit to that place; the gate no longer holds the task ("a handoff for
ticket ..., which this gate does not hold") and never gives the grant back.  The parked copy
then finds its ticket HELD_ELSEWHERE and drops itself as a duplicate: the body never runs, the
task stays PENDING.

Real workers on the session's Redis (broker, results and semaphores, in database ``DB``):

* node ``a`` (prefork, 2 children, ``semaphore_worker_hold=1``) reaches the semaphores through
  a proxy that, in mode ``scripts`` (see tests/chaos/proxy.py), closes every connection that
  sends a script call (EVALSHA) before Redis sees it; everything else (the gate's BLMPOP, the
  broker) passes;
* node ``b`` reaches Redis directly, and runs a body of ``main`` (limit 1) that ends when the
  test says.

``a`` holds ``filler`` (waiting on ``other``, which the test holds: it fills the hold of 1)
and then ``job`` (waiting on ``main``, at the head of its line: it overflows the hold).
"""

from __future__ import annotations

import dataclasses
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery.result import AsyncResult

from celery_semaphore import Semaphore
from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix
from tests.integration.workers import Worker, start_workers, stop_workers, wait_until

from .harness import Chaos
from .proxy import Proxy
from .tasks_claims import BACKOFF, LEASE, filler, hold_until, job

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]

#: a database of its own (broker, results, semaphores): kombu's Redis transport keeps one index
#: of unacknowledged messages per database, and a worker with a short visibility_timeout (other
#: tests') restores every message in it, this test's parked copy included
DB = 11


@dataclasses.dataclass
class Cluster:
    chaos: Chaos
    a: Worker
    b: Worker
    b_queue: str
    proxy: Proxy


@pytest.fixture
def cluster(redis_server: RedisServer) -> Iterator[Cluster]:
    direct = redis_server.url(DB)
    proxy = Proxy(redis_server.port, redis_server.host)
    chaos = Chaos(
        sem_url=direct,
        broker_url=direct,
        backend_url=direct,
        limit=1,
        lease=LEASE,
        extra={"include": ["tests.chaos.tasks_claims"], "semaphore_worker_hold": 1},
    )
    b_queue = chaos.env.queue + "-b"
    env_a = dataclasses.replace(chaos.env, redis_url=proxy.url(DB))
    nodes: list[Worker] = []
    try:
        nodes = [
            *start_workers(env_a, {"concurrency": 2, "name": "a"}),
            *start_workers(chaos.env, {"concurrency": 2, "name": "b", "queues": [b_queue]}),
        ]
        yield Cluster(chaos, nodes[0], nodes[1], b_queue, proxy)
    finally:
        proxy.set_mode("pass")
        stop_workers(nodes)
        proxy.close()
        chaos.close()
        client = redis_server.client(DB)
        delete_prefix(client, chaos.env.prefix)
        client.delete(chaos.env.queue, b_queue)
        client.close()


def _send(chaos: Chaos, name: str, args: tuple[Any, ...], **options: Any) -> AsyncResult:
    task_id = str(uuid.uuid4())
    result: AsyncResult = chaos.app.send_task(name, args, task_id=task_id, **options)
    chaos.expect[task_id] = {"SUCCESS"}
    chaos.results[task_id] = result
    return result


def _lines(node: Worker, task_id: str) -> str:
    return "\n".join(line for line in node.log().splitlines() if task_id in line)


def _wait_bounded(predicate: Any, timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate`` up to ``timeout`` seconds; whether it came true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def test_overflow_task_sent_to_its_slot_by_a_failed_retry_still_runs(cluster: Cluster) -> None:
    """Every task finishes (the job included), never more than 1 body of ``main`` inside, no
    holder nor waiter left."""
    chaos, a, b, proxy = cluster.chaos, cluster.a, cluster.b, cluster.proxy
    main = chaos.semaphore()
    other = Semaphore("other", 1, redis=chaos.env.redis_url, key_prefix=chaos.env.prefix)
    other_permit = other.acquire(blocking=False)  # ``filler`` waits until the test lets go
    assert other_permit is not None
    try:
        # node b holds main's only unit until the test says
        marker = f"release-{uuid.uuid4().hex[:6]}"
        blocker = _send(chaos, hold_until.name, ("blocker", marker, 40.0), queue=cluster.b_queue)
        wait_until(lambda: chaos.running(), 30, what="b's body runs")

        # node a holds two tasks: filler fills the hold of 1, the job overflows it
        fill = _send(chaos, filler.name, ("filler",))
        wait_until(lambda: other.waiters(), 20, what="a holds filler")
        overflow = _send(chaos, job.name, ("job", 0.1))
        ticket = f"{overflow.id}:0"
        wait_until(
            lambda: [w.ticket for w in main.waiters()] == [ticket], 20, what="a holds the job"
        )
        wait_until(  # its line is logged after its place is taken
            lambda: "semaphore_worker_hold is full" in _lines(a, overflow.id),
            10,
            what="the job overflows the hold of 1",
        )
        (place,) = main.waiters()
        assert place.owner.get("host") == a.name

        # a's script calls fail (b's do not), for as long as it takes the job's next try at
        # a tick to fail (uncounted, it is tried at every tick) and, today, to send the job to
        # its slot, whose wrapper fails too and parks it (its copy comes back in BACKOFF s)
        proxy.set_mode("scripts")
        wait_until(lambda: proxy.cuts > 0, 10, what="a script call of node a is dropped")
        _wait_bounded(lambda: "parked in the broker for" in _lines(a, overflow.id), 5.0)
        faulted = time.monotonic()
        proxy.set_mode("pass")

        # b's release: its unit goes to the job's place, before the parked copy comes back
        (chaos.dir / marker).touch()
        assert blocker.get(timeout=15) == "blocker"
        assert time.monotonic() - faulted < BACKOFF - 1, "the release came too late to matter"
        other_permit.release()
        other_permit = None

        if not _wait_bounded(lambda: overflow.ready(), BACKOFF + 15):
            lines = _lines(a, overflow.id)
            slot = "it goes to its slot" in lines
            dropped = re.search(r"this copy is a duplicate \(\w+\)", lines)
            unheld = "which this gate does not hold" in lines
            for node in (a, b):
                (chaos.dir / f"{node.name}.log").write_text(node.log())
            pytest.fail(
                f"the job never ran (state {overflow.state}): "
                + ("the gate sent it to its slot; " if slot else "")
                + ("its copy was dropped as a duplicate" if dropped else "no body")
                + ("; the gate ignored the handoff to its place" if unheld else "")
                + f"; holders {main.holders()} (logs in {chaos.dir})\nnode a's log for it:\n"
                + lines,
                pytrace=False,
            )
        report = chaos.assert_promise([a, b], results_within=15, holders_within=5)
        assert report.states["SUCCESS"] == 3
        assert fill.get(timeout=1) == "filler"
        assert report.counts.max == 1
        assert main.waiters() == []
        assert other.holders() == []
        assert other.waiters() == []
    finally:
        if other_permit is not None:
            other_permit.release()
