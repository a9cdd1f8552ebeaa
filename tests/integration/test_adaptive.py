"""Limits that follow the downstream service, on real workers (2 thread-pool nodes of 8
threads: more slots than the limit, so only the semaphore holds calls back).

A fake service (:func:`tests.integration.proj_rates._call_service`) refuses a call, as a 429
would, when more than its capacity are in flight, counted in Redis independently of the
semaphore.  The same storm under a fixed limit of 10 is the baseline, from the same run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from celery_semaphore import Semaphore
from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix

from . import proj_rates
from .workers import Env, Worker, start_workers, stop_workers, wait_until

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def nodes(redis_server: RedisServer) -> Iterator[tuple[Env, list[Worker]]]:
    env = Env(
        redis_url=redis_server.url(0),
        broker_url=redis_server.url(0),
        extra={"include": ["tests.integration.proj_rates"]},
    )
    started = start_workers(
        env,
        {"pool": "threads", "concurrency": 8, "name": "a"},
        {"pool": "threads", "concurrency": 8, "name": "b"},
    )
    try:
        yield env, started
    finally:
        stop_workers(started)
        client = redis_server.client(0)
        delete_prefix(client, env.prefix)
        client.delete(env.queue)


def _count(env: Env, what: str, kind: str) -> int:
    return int(env.redis().get(f"{env.prefix}:svc:{what}:{kind}") or 0)


def _storm(env: Env, task: object, calls: int) -> None:
    app = env.client_app()
    try:
        results = [app.send_task(task.name, (f"c{i}",)) for i in range(calls)]  # type: ignore[attr-defined]
        for result in results:
            result.get(timeout=90)
    finally:
        app.close()


class _Lowest:
    """The lowest effective limit seen while a storm runs (read every 20 ms)."""

    def __init__(self, sem: Semaphore) -> None:
        self.sem, self.lowest = sem, sem.limit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Lowest:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        deadline = time.monotonic() + 120
        while not self._stop.is_set() and time.monotonic() < deadline:
            self.lowest = min(self.lowest, self.sem.inspect().effective_limit)
            self._stop.wait(0.02)


def test_a_refusal_storm_lowers_the_limit_and_it_recovers(
    nodes: tuple[Env, list[Worker]],
) -> None:
    env, _ = nodes
    r = env.redis()
    r.set(f"{env.prefix}:svc:capacity", 3)
    adaptive = Semaphore("svc-adaptive", 10, redis=env.redis_url, key_prefix=env.prefix)

    # the baseline: a fixed limit of 10 against a service that takes 3 at once
    _storm(env, proj_rates.fixed_call, 60)
    refused_fixed = _count(env, "refused", "fixed")

    with _Lowest(adaptive) as seen:
        _storm(env, proj_rates.adaptive_call, 60)
    refused_adaptive = _count(env, "refused", "adaptive")
    assert _count(env, "ok", "adaptive") + refused_adaptive == 60
    # the limit came down to what the service takes (halved from 10: 5, then 2)
    assert seen.lowest <= 3, seen.lowest
    assert adaptive.inspect().throttles_total == refused_adaptive
    # far fewer refusals than under the fixed limit
    assert refused_fixed >= 20, refused_fixed
    assert refused_adaptive <= refused_fixed / 2, (refused_adaptive, refused_fixed)

    # the service recovers: calls succeed, and the limit climbs back to 10, never above
    r.set(f"{env.prefix}:svc:capacity", 100)
    for _ in range(4):
        if adaptive.inspect().effective_limit == 10:
            break
        _storm(env, proj_rates.adaptive_call, 60)
    snap = adaptive.inspect()
    assert snap.effective_limit == 10, snap
    assert snap.adaptive_limit is None or snap.adaptive_limit >= 10
    wait_until(lambda: not adaptive.holders(), 10, what="no holders after the storms")
    assert adaptive.waiters() == []
