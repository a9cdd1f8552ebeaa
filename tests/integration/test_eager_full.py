"""A bounded line in eager mode (``task_always_eager``): ``on_full="fail"`` raises
``SemaphoreFull`` to the caller; ``"drop"`` ends the call without running (IGNORED), never
blocking for the eager bound."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_semaphore import Semaphore, SemaphoreFull, limited
from celery_semaphore.ops.testing import RedisServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def app(redis_server: RedisServer, key_prefix: str) -> Iterator[Celery]:
    app = Celery(f"eager-full-{key_prefix}", set_as_current=False)
    app.conf.update(
        task_always_eager=True,
        task_eager_propagates=True,
        semaphore_redis_url=redis_server.url(0),
        semaphore_key_prefix=key_prefix,
        semaphore_eager_timeout=5.0,
    )
    yield app
    app.close()


def test_fail_raises_and_drop_ends_the_call_without_running(
    app: Celery, redis_server: RedisServer, key_prefix: str
) -> None:
    ran: list[str] = []

    @app.task(shared=False)
    @limited("eager-once", limit=1, max_waiting=0, on_full="fail")
    def failing(tag: str) -> str:
        ran.append(tag)
        return tag

    @app.task(shared=False)
    @limited("eager-once", limit=1, max_waiting=0, on_full="drop")
    def dropping(tag: str) -> str:
        ran.append(tag)
        return tag

    app.finalize(auto=True)
    sem = Semaphore("eager-once", 1, redis=redis_server.url(0), key_prefix=key_prefix)
    held = sem.acquire(blocking=False)
    assert held is not None
    began = time.monotonic()
    with pytest.raises(SemaphoreFull, match="line is full"):
        app.tasks[failing.name].delay("f")
    result: Any = app.tasks[dropping.name].delay("d")
    assert result.state == "IGNORED"
    assert time.monotonic() - began < 2.0  # refused at once, not after the eager bound
    assert ran == []
    held.release()
    assert app.tasks[dropping.name].delay("ok").get() == "ok"
    assert ran == ["ok"]
    assert sem.waiters() == []
