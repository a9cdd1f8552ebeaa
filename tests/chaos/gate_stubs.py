"""Stand-ins for the parts of Celery's consumer and request that the worker-side gate uses, so
a gate can run in the test's process, on a real Redis, with its hub and pool under the test's
control."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from celery import Celery

from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix


@contextmanager
def gate_app(
    redis_server: RedisServer, main: str, semaphore_url: str | None = None
) -> Iterator[Celery]:
    """An app whose semaphores, broker and results are on ``redis_server`` under a key prefix
    of its own (the broker's queue too), all deleted afterwards; ``semaphore_url``: the
    semaphores' way to that server (a proxy)."""
    prefix = f"cstest-{uuid.uuid4().hex[:10]}"
    url = redis_server.url(0)
    app = Celery(main, broker=url, backend=url, set_as_current=False)
    app.conf.update(
        semaphore_redis_url=semaphore_url or url,
        semaphore_key_prefix=prefix,
        task_default_queue=prefix,
    )
    try:
        yield app
    finally:
        client = redis_server.client(0)
        delete_prefix(client, prefix)
        client.close()


class StoppedConsumer:
    """What the gate uses of Celery's consumer, with a hub that keeps the callbacks it is given
    (``soon``) instead of running them: a hub that has stopped, or a pool with no free slot,
    until the test runs them."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.hostname = f"stub-{uuid.uuid4().hex[:6]}@localhost"
        self.pool: Any = None
        self.qos = SimpleNamespace(
            increment_eventually=lambda: None, decrement_eventually=lambda: None
        )
        self.soon: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.soon.append((fn, args))


class Request:
    """The parts of celery.worker.request.Request the gate reads."""

    def __init__(self, task: Any) -> None:
        self.task, self.name, self.id = task, task.name, str(uuid.uuid4())
        self.request_dict: dict[str, Any] = {"retries": 0}
        self.args: list[Any] = []
        self.kwargs: dict[str, Any] = {}
        self.delivery_info: dict[str, Any] = {}
        self.expires = None
        self.time_start: float | None = None
        #: the pool child that accepted it (None: not accepted yet)
        self.worker_pid: int | None = None

    def revoked(self) -> bool:
        return False

    def on_success(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_failure(self, exc_info: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def on_retry(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_accepted(self, *args: Any, **kwargs: Any) -> None:
        pass

    def acknowledge(self) -> None:
        pass
