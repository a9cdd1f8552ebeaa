"""``celery semaphore reset`` wakes the tasks it withdraws, on real workers.

A reset drops every holder and waiter.  The waiting tasks must learn at once that their place
is gone and ask again: a task held by a worker's gate would otherwise notice only when it next
refreshes its place (a third of its lease: 20 s with the default 60 s lease), and a task
parked in the broker only when its countdown ends (30 s for ``parks_long``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix
from tests.integration import proj
from tests.integration.helpers import semaphore
from tests.integration.workers import Env, start_worker, wait_until

from .conftest import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

#: well under what the task would wait without the wake-up (20 s held, 30 s parked)
PROMPTLY = 8.0


@pytest.fixture(params=["held", "parked"])
def env(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[Env]:
    env = Env(redis_url=redis_server.url(0), broker_url=redis_server.url(0), limit=1)
    if request.param == "parked":  # no gate: the task parks in the broker
        env.extra = {"semaphore_worker_hold": 0}
    yield env
    client = redis_server.client(0)
    delete_prefix(client, env.prefix)
    client.delete(env.queue)
    client.close()


def test_reset_wakes_the_tasks_it_withdraws(env: Env) -> None:
    node = start_worker(env, pool="threads", concurrency=2)
    app = env.client_app()
    sem = semaphore(env)
    try:
        blocker = sem.acquire(blocking=False)  # the only unit, held outside the workers
        assert blocker is not None
        waiting = app.send_task(proj.parks_long.name, ("w", 0.05))
        wait_until(lambda: len(sem.waiters()) == 1, 30, what="the task waits in line")
        parked = sem.waiters()[0].owner.get("held_by") is None
        assert parked == bool(env.extra)  # it waits the way this case means
        result = run_cli(app, "reset", "main", "--yes")
        assert result.exit_code == 0, result.output
        assert "released 1 holder(s), withdrew 1 waiter(s)" in result.stdout
        assert waiting.get(timeout=PROMPTLY) == "w"
        wait_until(lambda: not sem.inspect().holders, 10, what="no permit left")
    finally:
        app.close()
        node.stop()
