"""acks_late + reject_on_worker_lost: a task whose process dies is redelivered, and runs once
more with a permit, without ever being held twice.

``proj.crash_once`` SIGKILLs its own prefork child on the first delivery (a Redis flag tells
the deliveries apart) while holding its permit; the parent sees the lost worker and, because of
``reject_on_worker_lost``, requeues the message; the redelivered copy completes.  A sampler
reads ``holders()`` all along: the task's id must never appear on two holders at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix

from . import proj
from .conftest import RABBIT_URL, delete_rabbit_queue, require_rabbit
from .helpers import HolderSampler, holders, inside, ledger, max_inside, ran, semaphore
from .workers import Env, Worker, start_worker, wait_until

pytestmark = pytest.mark.timeout(120)

#: the short visibility_timeout test's database: kombu's Redis transport keeps one index of
#: unacknowledged messages per database, and a worker with a 1 s visibility_timeout restores
#: every message in it older than that, those of tests running beside this one included
OWN_DB = 8

#: what a worker logs when a copy of a task finds that another copy ran (or runs) it
DROPPED = "this copy is a duplicate"


@pytest.fixture(params=["redis", "rabbitmq"])
def node(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[tuple[Env, Worker]]:
    if request.param == "rabbitmq":
        require_rabbit()
        broker = RABBIT_URL
    else:
        broker = redis_server.url(0)
    env = Env(redis_url=redis_server.url(0), broker_url=broker, limit=2)
    worker = start_worker(env, pool="prefork", concurrency=2)
    try:
        yield env, worker
    finally:
        worker.stop()
        client = redis_server.client(0)
        delete_prefix(client, env.prefix)
        client.delete(env.queue)
        client.close()
        if request.param == "rabbitmq":
            delete_rabbit_queue(env)


def test_killed_acks_late_task_is_redelivered_and_never_double_held(
    node: tuple[Env, Worker],
) -> None:
    env, worker = node
    app = env.client_app()
    with HolderSampler(env, interval=0.005) as sampler:
        result = app.send_task(proj.crash_once.name, ("c", 0.5))
        assert result.get(timeout=60) == "c:redelivered"
        wait_until(lambda: not holders(env), 10, what="no holders after the redelivered run")
    assert not sampler.errors

    attempts = ledger(env, "attempts:c")
    assert len(attempts) == 2, attempts  # killed once, then redelivered once
    pids = [a.split(":")[0] for a in attempts]
    assert pids[0] != pids[1]  # the second run is in a new child
    assert ran(env) == ["c"]  # the body proper ran once, on the redelivery
    assert max_inside(env) == 1

    mine = [hs for _, hs in sampler.of_task(result.id)]
    assert sum(1 for hs in mine if hs) > 20, "the sampler never saw the task hold its permit"
    doubled = [hs for hs in mine if len(hs) > 1]
    assert not doubled, f"held twice at once: {doubled[:3]}"
    tokens = {h.token for hs in mine for h in hs}
    assert tokens == {f"{result.id}:0"}
    assert "permit LOST" not in worker.log()


def test_visibility_timeout_redelivery_does_not_exceed_the_limit(
    redis_server: RedisServer,
) -> None:
    """Limit 1, Redis broker with visibility_timeout=1 s: an acks_late task still running
    after 1 s is handed out again (a second worker's start restores it).  Two bodies must
    never be inside at once: the copy should wait (or be dropped) while the original runs."""
    url = redis_server.url(OWN_DB)
    env = Env(
        redis_url=url,
        broker_url=url,
        limit=1,
        extra={"broker_transport_options": {"visibility_timeout": 1}},
    )
    first = start_worker(env, pool="prefork", concurrency=2)
    second = None
    try:
        app = env.client_app()
        result = app.send_task(proj.late_work.name, ("v", 6.0))
        wait_until(lambda: ran(env) == ["v"], 20, what="the task started")
        time.sleep(1.5)  # let the visibility timeout pass (nothing to poll for)
        second = start_worker(env, pool="prefork", concurrency=2)  # restores unacked messages
        assert result.get(timeout=30) == "v"
        workers = (first, second)

        def copy_settled() -> bool:
            # the copy runs after the original (never beside it), or finds the task done and
            # drops itself (logged by whichever worker got it)
            return len(ran(env)) >= 2 or any(DROPPED in w.log() for w in workers)

        try:
            wait_until(copy_settled, 20, what="the redelivered copy ran or dropped itself")
        except TimeoutError:
            pytest.skip("the broker did not redeliver the running task this time")
        wait_until(lambda: inside(env) == 0, 15, what="both copies finished")
        assert max_inside(env) == 1, f"{max_inside(env)} bodies inside at once, limit 1"
    finally:
        first.stop()
        if second is not None:
            second.stop()
        client = redis_server.client(OWN_DB)
        delete_prefix(client, env.prefix)
        client.delete(env.queue)
        client.close()


def test_an_acks_late_execution_is_remembered_until_a_redelivered_copy_could_return(
    node: tuple[Env, Worker],
) -> None:
    """An acks_late message may come again after its body ended (a visibility timeout that ran
    out while it ran: that copy waits, parked, and comes back on its back-off).  The ticket is
    remembered as done for longer than such a copy's back-off, not the default 10 s, so the
    copy finds it done and drops itself instead of running the body twice (issue 17)."""
    env, _ = node
    app = env.client_app()
    result = app.send_task(proj.late_work.name, ("t", 0.05))
    assert result.get(timeout=30) == "t"
    client = env.redis()
    try:
        wait_until(lambda: not holders(env), 10, what="released")
        expiry_ms = client.zscore(semaphore(env).keys.expiry, f"h:{result.id}:0")
        seconds, micros = client.time()
        assert expiry_ms is not None, "no tombstone left for the finished acks_late execution"
        left = expiry_ms / 1000 - (seconds + micros / 1e6)
        assert left > 60, f"the tombstone lasts {left:.1f}s: a redelivered copy could run again"
    finally:
        client.close()
