"""Fixtures for the Celery-layer tests: an :class:`Env` per test (its own key prefix and queue),
on the Redis broker or on RabbitMQ."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix
from tests.route import unavailable

from .workers import Env

RABBIT_URL = os.environ.get("CELERY_SEMAPHORE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _rabbit_reachable() -> bool:
    parts = urlsplit(RABBIT_URL)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or 5672), timeout=1
        ):
            return True
    except OSError:
        return False


@pytest.fixture
def env(redis_server: RedisServer) -> Iterator[Env]:
    """Redis as broker and semaphore store."""
    e = Env(redis_url=redis_server.url(0), broker_url=redis_server.url(0))
    yield e
    client = redis_server.client(0)
    delete_prefix(client, e.prefix)
    client.delete(e.queue)
    client.close()


def require_rabbit() -> None:
    """Skip when RabbitMQ is not reachable; on CI (``CI=true``) that is a failure."""
    if not _rabbit_reachable():
        unavailable(f"RabbitMQ not reachable at {RABBIT_URL}", beyond_the_route=True)


def delete_rabbit_queue(e: Env, *queues: str) -> None:
    """Best effort: drop the test's queues (default: ``e.queue``) from RabbitMQ (they are
    durable, and would pile up)."""
    app = e.client_app()
    try:
        with app.connection_for_write() as conn:
            for queue in queues or (e.queue,):
                conn.default_channel.queue_delete(queue)
    except Exception:  # cleanup only; never fail a test on it
        pass
    finally:
        app.close()


@pytest.fixture
def rabbit_env(redis_server: RedisServer) -> Iterator[Env]:
    """RabbitMQ as broker, Redis as semaphore store (required on CI)."""
    require_rabbit()
    e = Env(redis_url=redis_server.url(0), broker_url=RABBIT_URL)
    yield e
    client = redis_server.client(0)
    delete_prefix(client, e.prefix)
    client.close()
    delete_rabbit_queue(e)
