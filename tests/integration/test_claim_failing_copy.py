"""A copy of a task that fails without ever holding the permit must not free the permit the
other copy holds (limit 1, real prefork workers, Redis broker).

Two messages of one execution share its ticket (``<task id>:<retries>``), each delivery with
its own claim.  The copy that runs holds the ticket under its claim; the other copy waits and
fails with ``SemaphoreTimeout``.  Its ``task_failure`` must release nothing: the permit belongs
to the running copy until its body ends.  If the failing copy released the ticket without its
claim, a third task would be granted the unit while the running body is still inside: two
bodies at once at limit 1.

* :func:`test_timed_out_copy_of_a_running_task_does_not_free_its_permit`: two messages sent
  with one task id, while a blocker holds the unit, so that both copies wait in line (one
  place, one ticket); the blocker's release grants one copy, the other stays held by its
  gate until ``max_wait`` and fails.
* :func:`test_redelivered_copy_that_times_out_does_not_free_the_running_permit`: an
  ``acks_late`` task still running past the broker's ``visibility_timeout`` is delivered again;
  the redelivered copy waits (parks) for its previous delivery's permit, then times out.

The bodies count themselves (``tests.integration.proj.Body``, counter ``"claims"``),
independently of the semaphore.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix

from . import proj_claims
from .helpers import finished_at, holders, inside, max_inside, ran, started_at
from .workers import Env, Worker, start_workers, stop_workers, wait_until

pytestmark = pytest.mark.timeout(90)

#: the short visibility_timeout test's database: kombu's Redis transport keeps one index of
#: unacknowledged messages per database, and a worker with a 6 s visibility_timeout restores
#: every message in it older than that, those of tests running beside this one included
OWN_DB = 9

NAME = proj_claims.NAME
INCLUDE = {"include": ["tests.integration.proj_claims"]}
#: what a worker logs when a copy gives up waiting (runtime._timeout)
TIMED_OUT = "SemaphoreTimeout"
#: what a worker logs when a copy finds that another copy runs (or ran) the task
DROPPED = "this copy is a duplicate"


def _nodes(env: Env, count: int = 2) -> list[Worker]:
    spec = {"pool": "prefork", "concurrency": 2}
    return start_workers(env, *({**spec, "name": f"claims{i}"} for i in range(count)))


def _cleanup(env: Env, redis_server: RedisServer, db: int = 0) -> None:
    client = redis_server.client(db)
    delete_prefix(client, env.prefix)
    client.delete(env.queue)
    client.close()


def _logs(nodes: list[Worker]) -> str:
    return "\n".join(w.log() for w in nodes)


def _copy_settled(app: Celery, task_id: str, nodes: list[Worker]) -> bool:
    """The waiting copy timed out (its failure is stored or logged), or dropped itself."""
    if app.AsyncResult(task_id).state == "FAILURE":
        return True
    text = _logs(nodes)
    return TIMED_OUT in text or DROPPED in text


def _check_one_inside(env: Env, long_tag: str, third: str, nodes: list[Worker]) -> None:
    wait_until(lambda: inside(env, NAME) == 0, 30, what="every body finished")
    begun, ended = started_at(env), finished_at(env)
    assert max_inside(env, NAME) == 1, (
        f"{max_inside(env, NAME)} bodies inside at once at limit 1: the failing copy freed "
        f"the running copy's permit ({third!r} started at {begun.get(third)}, while "
        f"{long_tag!r} ran from {begun.get(long_tag)} to {ended.get(long_tag)})\n"
        + "\n".join(
            line
            for line in _logs(nodes).splitlines()
            if "released the permit" in line or TIMED_OUT in line or DROPPED in line
        )[-3000:]
    )
    assert begun[third] >= ended[long_tag], (begun, ended)
    wait_until(lambda: not holders(env, NAME), 15, what="nothing held afterwards")


@pytest.fixture
def claims_env(redis_server: RedisServer) -> Iterator[Env]:
    url = redis_server.url(0)
    env = Env(redis_url=url, broker_url=url, limit=1, extra=dict(INCLUDE))
    yield env
    _cleanup(env, redis_server)


def test_timed_out_copy_of_a_running_task_does_not_free_its_permit(claims_env: Env) -> None:
    env = claims_env
    nodes = _nodes(env)
    try:
        app = env.client_app()
        blocker = app.send_task(proj_claims.hold_one.name, ("blocker", 1.5))
        wait_until(lambda: "blocker" in ran(env), 20, what="the blocker's body started")

        # two messages of one execution: both wait in line behind the blocker (one ticket)
        task_id = uuid.uuid4().hex
        for _ in range(2):
            app.send_task(proj_claims.hold_one.name, ("x", 6.0), task_id=task_id)
        wait_until(lambda: "x" in ran(env), 20, what="one copy of x runs")
        assert blocker.get(timeout=20) == "blocker"
        # the other copy gives up (max_wait 2.5 s) while the first still runs
        wait_until(
            lambda: _copy_settled(app, task_id, nodes),
            20,
            what="the second copy of x timed out (or dropped itself)",
        )
        assert inside(env, NAME) == 1, "x's body should still be running"

        third = app.send_task(proj_claims.patient_one.name, ("z", 0.2))
        assert third.get(timeout=30) == "z"
        assert ran(env).count("x") == 1, ran(env)
        _check_one_inside(env, "x", "z", nodes)
    finally:
        stop_workers(nodes)


def test_redelivered_copy_that_times_out_does_not_free_the_running_permit(
    redis_server: RedisServer,
) -> None:
    """Limit 1, ``acks_late``, Redis broker with ``visibility_timeout=6`` (restored every
    second): the broker hands the task out again while its 20 s body runs; the redelivered
    copy parks behind its own running delivery and fails after ``max_wait=4``."""
    url = redis_server.url(OWN_DB)
    options: dict[str, Any] = {
        "visibility_timeout": 6,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }
    env = Env(
        redis_url=url,
        broker_url=url,
        limit=1,
        extra={**INCLUDE, "broker_transport_options": options},
    )
    nodes = _nodes(env)
    try:
        app = env.client_app()
        result = app.send_task(proj_claims.late_one.name, ("v", 20.0))
        wait_until(lambda: "v" in ran(env), 20, what="v's body started")
        try:
            wait_until(
                lambda: _copy_settled(app, result.id, nodes),
                20,
                what="the redelivered copy of v timed out (or dropped itself)",
            )
        except TimeoutError:
            pytest.skip("the broker did not redeliver the running task this time")
        assert inside(env, NAME) == 1, "v's body should still be running"

        third = app.send_task(proj_claims.patient_one.name, ("z", 0.2))
        assert third.get(timeout=40) == "z"
        assert ran(env).count("v") == 1, ran(env)
        _check_one_inside(env, "v", "z", nodes)
    finally:
        stop_workers(nodes)
        _cleanup(env, redis_server, OWN_DB)
