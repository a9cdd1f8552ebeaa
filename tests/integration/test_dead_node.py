"""Issue 31: a whole worker node SIGKILLed gives its permits to the other nodes within seconds
(its liveness record expires: ``semaphore_liveness_ttl``), not when their leases do; and a
body that holds the GIL of its pool child for longer than that keeps its permit (the record is
the worker's, refreshed by its main process).

Two real prefork nodes, each consuming its own queue (so which node runs what is decided by
the test), Redis broker; concurrency counted by an independent counter in the task bodies.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix

from . import proj
from .helpers import inside, max_inside, semaphore
from .workers import Env, Worker, start_worker, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def env(redis_server: RedisServer) -> Iterator[Env]:
    env = Env(redis_url=redis_server.url(0), broker_url=redis_server.url(0), limit=2, lease=60.0)
    yield env
    client = redis_server.client(0)
    delete_prefix(client, env.prefix)
    client.delete(env.queue, f"{env.queue}-a", f"{env.queue}-b")


def _node(env: Env, name: str) -> Worker:
    return start_worker(env, concurrency=2, name=name, queues=[f"{env.queue}-{name}"])


def test_a_killed_node_permits_go_to_the_other_node_within_seconds(env: Env) -> None:
    a, b = _node(env, "a"), _node(env, "b")
    app = env.client_app()
    try:
        for i in range(2):  # all the units, held on a by long bodies
            app.send_task(proj.work.name, (f"long{i}", 90.0), queue=f"{env.queue}-a")
        wait_until(lambda: inside(env) == 2, 30, what="both units held on node a")
        waiting = [
            app.send_task(proj.work.name, (f"b{i}", 0.5), queue=f"{env.queue}-b") for i in range(2)
        ]
        time.sleep(1.0)
        assert not any(r.ready() for r in waiting)  # b's tasks wait: a holds every unit
        killed = time.monotonic()
        a.signal(signal.SIGKILL)  # the whole node: main process and pool children
        a.process.wait(timeout=10)
        # the killed bodies never left: out of the independent counter (b's cannot be in yet)
        client = env.redis()
        client.set(f"{env.prefix}:inside:main", 0)
        client.set(f"{env.prefix}:max:main", 0)
        assert [r.get(timeout=30) for r in waiting] == ["b0", "b1"]
        took = time.monotonic() - killed
        # the record's 3 s (and a wake-up), far below the 60 s lease
        assert took < 15.0, f"the dead node's permits came back after {took:.1f} s"
        assert max_inside(env) == 2  # never more than the limit inside
        assert int(client.hget(semaphore(env).keys.state, "died") or 0) == 2
        print(f"node killed: its permits on the other node after {took:.2f} s")
    finally:
        for node in (a, b):
            node.stop()
        app.close()


def test_a_body_holding_the_gil_of_its_child_keeps_its_permit(env: Env) -> None:
    """The body holds its child's GIL for about 3 s, five liveness TTLs of 0.6 s: no thread of
    that child runs meanwhile, yet its permit is kept (its worker's main process refreshes the
    record) and no second body enters.  The gate is off: the child acquires itself."""
    env.limit = 1
    env.extra = {"semaphore_liveness_ttl": 0.6, "semaphore_worker_hold": 0}
    node = _node(env, "a")
    app = env.client_app()
    try:
        hog = app.send_task(proj.hog.name, ("hog", 2 * 10**8), queue=f"{env.queue}-a")
        wait_until(lambda: inside(env) == 1, 30, what="the hog holds the unit")
        other = app.send_task(proj.work.name, ("other", 0.1), queue=f"{env.queue}-a")
        assert hog.get(timeout=60) == "hog"
        assert other.get(timeout=60) == "other"
        assert max_inside(env) == 1
        assert env.redis().hget(semaphore(env, limit=1).keys.state, "died") is None
    finally:
        node.stop()
        app.close()
