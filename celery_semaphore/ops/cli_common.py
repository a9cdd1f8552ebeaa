"""What every ``celery semaphore`` command shares: the exit codes, the one-line errors, the
app's Redis connection (:class:`Ops`) and ``--json`` printing.

The command modules (:mod:`.cli_read`, :mod:`.cli_actions`, :mod:`.cli_serve`) import this one;
:mod:`.cli` gathers their commands into the ``semaphore`` group.  Like them it imports nothing
beyond click at module level: Redis, the core and the Celery layer are imported when a command
runs (every ``celery`` invocation, workers included, imports the plugin).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click

__all__ = [
    "EXIT_CANCELLED",
    "EXIT_NOT_FOUND",
    "EXIT_REDIS",
    "EXIT_USAGE",
    "CliError",
    "Ops",
    "app_of",
    "confirm_or_cancel",
    "fail",
    "handle_errors",
    "json_option",
    "print_json",
]

EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_REDIS = 3
EXIT_CANCELLED = 4

_F = TypeVar("_F", bound=Callable[..., Any])


class CliError(Exception):
    """A failure reported as one line on stderr and an exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def fail(message: str, code: int = EXIT_NOT_FOUND) -> NoReturn:
    raise CliError(message, code)


def handle_errors(fn: _F) -> _F:
    """Turn CliError, Redis and semaphore errors into one line on stderr and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from redis.exceptions import RedisError

        from ..core.exceptions import SemaphoreError
        from ..logs import printable

        try:
            return fn(*args, **kwargs)
        except CliError as exc:
            message, code = str(exc), exc.code
        except (SemaphoreError, RedisError) as exc:
            message, code = f"Redis failed: {exc}", EXIT_REDIS
        # names in a message are quoted by repr (backslashes doubled) or escaped already: what
        # is left of a control (a producer's text in an exception) is escaped, on one line
        message = printable(message, keep="\\")
        click.echo(f"celery semaphore: error: {message}", err=True)
        raise click.exceptions.Exit(code)

    return wrapper  # type: ignore[return-value]


def confirm_or_cancel(question: str, command: str) -> None:
    """Ask ``question``; exit 4 (``command`` cancelled) unless the answer is yes."""
    try:
        confirmed = click.confirm(question, default=False)
    except click.Abort:
        confirmed = False
    if not confirmed:
        fail(f"{command} cancelled (use --yes to skip the question)", EXIT_CANCELLED)


def app_of(ctx: click.Context) -> Any:
    """The Celery app of ``celery -A proj``; exit 2 without one."""
    app = getattr(ctx.find_root().obj, "app", None)
    if app is None:
        fail("no Celery app: run it as `celery -A proj semaphore ...`", EXIT_USAGE)
    return app


class Ops:
    """The app's Redis client and key prefix, connected on first use."""

    def __init__(self, ctx: click.Context) -> None:
        app = self.app = app_of(ctx)
        self._client: Any = None
        self._semaphores: dict[tuple[str, int | None], Any] = {}
        self.url = ""
        from ..core.keys import validate_prefix
        from ..integration.config import redis_settings, validate_app_settings
        from ..integration.signals import check_app

        # what a worker refuses at start, the CLI refuses too, in the same words: first the
        # settings (a misspelt semaphore_redis_url among them), then where Redis is, then
        # the limited tasks against the settings
        try:
            validate_app_settings(app.conf, getattr(app, "namespace", None))
        except (TypeError, ValueError) as exc:
            fail(f"invalid configuration: {exc}", EXIT_USAGE)
        try:
            self.redis = redis_settings(app.conf)
            self.url = self.redis.url
            self.prefix = validate_prefix(app.conf.get("semaphore_key_prefix", "celery_semaphore"))
        except (TypeError, ValueError) as exc:
            fail(str(exc), EXIT_REDIS)
        try:
            check_app(app)
        except (TypeError, ValueError) as exc:
            fail(f"invalid configuration: {exc}", EXIT_USAGE)

    @property
    def client(self) -> Any:
        if self._client is None:
            from redis.exceptions import RedisError

            from ..core.connection import connect_failure, redis_client

            try:
                client = redis_client(
                    self.url,
                    cluster=self.redis.cluster,
                    options=self.redis.options,
                    socket_connect_timeout=3,
                    socket_timeout=10,
                    retries=1,
                )
                client.ping()
            except RedisError as exc:
                fail(connect_failure(self.url, self.redis.options, exc), EXIT_REDIS)
            self._client = client
        return self._client

    def known(self, *, scan: bool = True) -> dict[str, Any]:
        from . import registry

        try:
            return registry.known(self.client, self.prefix, self.app, scan=scan)
        except (TypeError, ValueError) as exc:  # e.g. a malformed semaphore_limits
            fail(f"invalid configuration: {exc}", EXIT_USAGE)

    def has_state(self, name: str) -> bool:
        """Has Redis state for ``name``, at its keys as ``semaphore_hash_tag`` lays them out."""
        from ..core.keys import SemaphoreKeys

        hash_tag = self.app.conf.get("semaphore_hash_tag", None)
        return bool(self.client.exists(SemaphoreKeys.for_name(name, self.prefix, hash_tag).state))

    def entry(self, name: str) -> Any:
        """The Known entry for ``name``; exit 1 when no source knows it."""
        from .registry import Known

        entries = self.known(scan=False)
        if name in entries:
            return entries[name]
        if self.has_state(name):
            return Known(name, found_in={"redis"})
        fail(
            f"unknown semaphore {name!r} under key prefix {self.prefix!r}: no task of the app "
            "uses it, no worker registered it and Redis has no state for it "
            "(see `celery semaphore list`)"
        )

    def semaphore(self, entry: Any) -> Any:
        """A (cached) Semaphore object for a Known entry."""
        from .actions import operable

        key = (entry.name, entry.configured_limit)
        sem = self._semaphores.get(key)
        if sem is None:
            hash_tag = self.app.conf.get("semaphore_hash_tag", None)
            # wakes tasks held by a worker or parked in the broker, as a worker's release
            # would: a forced release or a reset lets them ask again at once
            sem = operable(self.app, self.client, self.prefix, entry, hash_tag)
            self._semaphores[key] = sem
        return sem


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
