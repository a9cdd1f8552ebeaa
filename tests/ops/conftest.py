"""Fixtures for the ops tests: a Celery app with limited tasks under this test's key prefix,
and ``cli(...)``, which runs ``celery semaphore ...`` for it through click's CliRunner."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result

from celery_semaphore import limited
from celery_semaphore.ops.cli import semaphore

Cli = Callable[..., Result]


def make_app(redis_url: str, prefix: str, **conf: Any) -> Celery:
    app = Celery("ops-test", broker=redis_url, backend=redis_url, set_as_current=False)
    app.conf.update(semaphore_redis_url=redis_url, semaphore_key_prefix=prefix, **conf)
    return app


def run_cli(app: Celery, *args: str, input: str | None = None) -> Result:
    """``celery semaphore <args>`` for ``app``, as the celery command would run it."""
    obj = CLIContext(app=app, no_color=True, workdir=None)
    return CliRunner().invoke(semaphore, list(args), obj=obj, input=input)


@pytest.fixture
def app(redis_url: str, key_prefix: str) -> Iterator[Celery]:
    """Two limited tasks on "alpha" (code limit 3), one on "beta" (code limit 2, overridden
    to 4 by ``semaphore_limits``)."""
    app = make_app(redis_url, key_prefix, semaphore_limits={"beta": 4})

    @app.task(name="ops.one", shared=False)
    @limited("alpha", limit=3)
    def one() -> None: ...

    @app.task(name="ops.two", shared=False)
    @limited("alpha", limit=3, weight=2)
    def two() -> None: ...

    @app.task(name="ops.three", shared=False)
    @limited("beta", limit=2)
    def three() -> None: ...

    yield app
    app.close()


@pytest.fixture
def cli(app: Celery) -> Cli:
    def run(*args: str, input: str | None = None) -> Result:
        return run_cli(app, *args, input=input)

    return run
