"""Which queue a message was delivered from: consumer tag first, then the worker's queues by
exchange and routing key, then the routing key."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from kombu.entity import Exchange as _Exchange
from kombu.entity import Queue as _Queue

from celery_semaphore.integration.queues import delivery_queue

Exchange: Any = _Exchange  # kombu is untyped
Queue: Any = _Queue


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("unit-queues", broker="memory://", set_as_current=False)
    tasks = Exchange("tasks", type="direct")
    app.conf.task_queues = [
        Queue("bulk", tasks, routing_key="work"),
        Queue("interactive", tasks, routing_key="work.fast"),
        Queue("work", tasks, routing_key="work"),
        Queue("plain"),
    ]
    yield app
    app.close()


def test_consumer_tag_names_the_queue(app: Celery) -> None:
    consumer = SimpleNamespace(
        task_consumer=SimpleNamespace(_active_tags={"bulk": "tag-1", "interactive": "tag-2"})
    )
    info = {"consumer_tag": "tag-1", "exchange": "tasks", "routing_key": "work"}
    assert delivery_queue(app, info, consumer) == "bulk"
    # an unknown tag falls back to the routing: a queue named like the key wins
    info["consumer_tag"] = "tag-9"
    assert delivery_queue(app, info, consumer) == "work"


def test_routing_matches_the_consumed_queues(app: Celery) -> None:
    info = {"exchange": "tasks", "routing_key": "work.fast"}
    assert delivery_queue(app, info) == "interactive"
    assert delivery_queue(app, {"exchange": "plain", "routing_key": "plain"}) == "plain"
    # only the worker's -Q selection counts
    app.amqp.queues.select(["bulk"])
    assert delivery_queue(app, {"exchange": "tasks", "routing_key": "work"}) == "bulk"


def test_default_exchange_routes_by_queue_name(app: Celery) -> None:
    assert delivery_queue(app, {"exchange": "", "routing_key": "interactive"}) == "interactive"


def test_unknown_routing_is_the_routing_key(app: Celery) -> None:
    assert delivery_queue(app, {"exchange": "x", "routing_key": "elsewhere"}) == "elsewhere"
    assert delivery_queue(app, {}) is None
    assert delivery_queue(app, None) is None
