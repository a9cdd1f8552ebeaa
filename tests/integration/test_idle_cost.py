"""Issue 31: an idle name costs nothing, and the registry forgets names nobody uses.

Real workers; the semaphores live on a Redis server of this module's own, so its
``INFO commandstats`` counts the workers' semaphore calls and nothing else (the broker, the
results and the tests' bookkeeping stay on the session's Redis).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from celery_semaphore.ops import registry
from celery_semaphore.ops.testing import RedisServer, start_redis_server

from . import proj
from .workers import Env, start_worker

pytestmark = pytest.mark.timeout(120)

NAMES = 50


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = start_redis_server()
    try:
        yield server
    finally:
        server.stop()


def _calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def test_after_the_tasks_of_50_names_end_an_idle_worker_makes_no_calls_for_them(
    env: Env, own_redis: RedisServer
) -> None:
    """A prefork worker (its gate, and two children that held the permits) runs one short
    task on each of 50 names (none waits: the limit is 2), then idles: while it idles it runs
    no script for any name (before issue 31, each of its three processes swept each name once
    a second: about 150 scripts a second), only its one liveness refresh a second, and makes
    about one call a second besides (the gate's blocking read of its wake list)."""
    env.extra = {"semaphore_redis_url": own_redis.url(0)}
    worker = start_worker(env, pool="prefork", concurrency=2)
    app = env.client_app()
    client = own_redis.client(0)
    try:
        results = [
            app.send_task(proj.per_customer.name, (f"c{n}", f"t{n}", 0.01)) for n in range(NAMES)
        ]
        assert sorted(r.get(timeout=60) for r in results) == sorted(f"t{n}" for n in range(NAMES))
        time.sleep(2.0)  # the last releases are done; a sweep under way ends
        before = _calls(client)
        time.sleep(5.0)
        after = _calls(client)
        delta = {k: n - before.get(k, 0) for k, n in after.items()}
        delta = {k: n for k, n in delta.items() if n and k != "info"}  # info: ours
        scripts = sum(delta.get(k, 0) for k in ("evalsha", "eval", "fcall"))
        # the worker's liveness record: one refresh per third of semaphore_liveness_ttl (3 s),
        # for the whole worker (its pool children use it), whatever the number of names;
        # a per-name sweep would be 50 names x 3 processes a second
        assert scripts <= 5 + 2, f"scripts run while idle: {delta}"
        # (INFO commandstats also counts each refresh's four commands inside Redis: TIME,
        # ZREMRANGEBYSCORE, ZSCORE, ZADD)
        assert sum(delta.values()) <= 5 * 3 + 5 * scripts, f"calls while idle: {delta}"
        # the names still work: a task on one of them runs at once
        assert app.send_task(proj.per_customer.name, ("c7", "again", 0.01)).get(timeout=30)
    finally:
        worker.stop()
        app.close()
        client.close()


def test_the_registry_forgets_a_name_unused_for_semaphore_registry_forget_after(
    env: Env,
) -> None:
    """``semaphore_registry_forget_after = 1``: a name used once is listed, then forgotten
    once another name's use (by the same worker) comes more than a second later."""
    env.extra = {"semaphore_registry_forget_after": 1.0}
    worker = start_worker(env, pool="threads", concurrency=2)
    app = env.client_app()
    client = env.redis()
    try:
        assert app.send_task(proj.per_customer.name, ("old", "t1", 0.01)).get(timeout=30)
        assert "cust:old" in registry.read(client, env.prefix)
        time.sleep(1.5)
        # read with the setting: a name past its time is no longer listed, pruned or not
        assert "cust:old" not in registry.read(client, env.prefix, forget_after=1.0)
        assert app.send_task(proj.per_customer.name, ("new", "t2", 0.01)).get(timeout=30)
        known = registry.read(client, env.prefix)
        assert "cust:new" in known
        assert "cust:old" not in known, "the worker did not forget the unused name"
        assert client.zscore(registry.used_key(env.prefix), "cust:old") is None
    finally:
        worker.stop()
        app.close()
        client.close()
