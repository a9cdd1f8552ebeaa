"""The pytest plugin of celery-semaphore: fixtures for a throwaway Redis, an app and an
embedded worker pointed at it, and a recorder that checks limits from the outside
(``max_concurrency("api") <= 3``, ``no_permits_held()``).  See docs/testing.md.

Installed, it loads by itself (the ``pytest11`` entry point named ``celery_semaphore.pytest``);
``-p no:celery_semaphore.pytest`` turns it off, and ``-p celery_semaphore.pytest`` (or
``pytest_plugins = ["celery_semaphore.pytest"]`` in a root ``conftest.py``) loads it from a
checkout that is not installed.  Loading it has no side effects: Celery and redis-py are
imported, and Redis started, only when a test asks for a fixture.

The code lives in :mod:`celery_semaphore.ops.pytest_plugin` and
:mod:`celery_semaphore.ops.recording`; this module only names the plugin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .ops.pytest_plugin import (
    pytest_addoption,
    semaphore_app,
    semaphore_config,
    semaphore_key_prefix,
    semaphore_recorder,
    semaphore_redis,
    semaphore_redis_url,
    semaphore_worker,
    semaphore_worker_parameters,
)

if TYPE_CHECKING:
    from .ops.recording import BodyRecorder, PermitCheck

__all__ = [
    # the types of the fixtures' values, for annotations
    "BodyRecorder",
    "PermitCheck",
    # the plugin
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


def __getattr__(name: str) -> Any:
    # imported on first use: loading the plugin must not import Celery
    if name in ("BodyRecorder", "PermitCheck"):
        from .ops import recording

        return getattr(recording, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
