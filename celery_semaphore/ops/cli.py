"""``celery -A proj semaphore ...``: see and operate the semaphores from the terminal.

Registered as a Celery sub-command through the ``celery.commands`` entry point.  Every
``celery`` invocation (workers included) imports this module, so it imports nothing beyond
what ``celery`` itself already has loaded (click and ``celery.bin.base``); Redis, the core
and the rendering are imported inside the commands.

Exit codes (also in docs/cli.md):

==  ==================================================================================
0   done
1   not found: unknown semaphore, task not holding or waiting, token not held
2   usage error (bad option or argument, invalid settings, metrics extra or port)
3   Redis not configured, unreachable or failing (or holding data it should not)
4   cancelled at the confirmation prompt
==  ==================================================================================

Errors are one line on stderr, starting with ``celery semaphore: error:``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click
from celery.bin.base import CeleryCommand

__all__ = ["EXIT_CANCELLED", "EXIT_NOT_FOUND", "EXIT_REDIS", "EXIT_USAGE", "semaphore"]

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


def _fail(message: str, code: int = EXIT_NOT_FOUND) -> NoReturn:
    raise CliError(message, code)


def _handle_errors(fn: _F) -> _F:
    """Turn CliError, Redis and semaphore errors into one line on stderr and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from redis.exceptions import RedisError

        from ..core.exceptions import SemaphoreError

        try:
            return fn(*args, **kwargs)
        except CliError as exc:
            message, code = str(exc), exc.code
        except (SemaphoreError, RedisError) as exc:
            message, code = f"Redis failed: {exc}", EXIT_REDIS
        click.echo(f"celery semaphore: error: {message}", err=True)
        raise click.exceptions.Exit(code)

    return wrapper  # type: ignore[return-value]


class _Ops:
    """The app's Redis client and key prefix, connected on first use."""

    def __init__(self, ctx: click.Context) -> None:
        obj = ctx.find_root().obj
        app = getattr(obj, "app", None)
        if app is None:
            _fail("no Celery app: run it as `celery -A proj semaphore ...`", EXIT_USAGE)
        self.app = app
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
            _fail(f"invalid configuration: {exc}", EXIT_USAGE)
        try:
            self.redis = redis_settings(app.conf)
            self.url = self.redis.url
            self.prefix = validate_prefix(app.conf.get("semaphore_key_prefix", "celery_semaphore"))
        except (TypeError, ValueError) as exc:
            _fail(str(exc), EXIT_REDIS)
        try:
            check_app(app)
        except (TypeError, ValueError) as exc:
            _fail(f"invalid configuration: {exc}", EXIT_USAGE)

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
                _fail(connect_failure(self.url, self.redis.options, exc), EXIT_REDIS)
            self._client = client
        return self._client

    def known(self, *, scan: bool = True) -> dict[str, Any]:
        from . import registry

        try:
            return registry.known(self.client, self.prefix, self.app, scan=scan)
        except (TypeError, ValueError) as exc:  # e.g. a malformed semaphore_limits
            _fail(f"invalid configuration: {exc}", EXIT_USAGE)

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
        _fail(
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


def _safe_url(url: str) -> str:
    """The URL without its password."""
    from ..core.connection import safe_url

    return safe_url(url)


def _print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")


@click.group(name="semaphore")
def semaphore(**_: Any) -> None:
    """See and operate celery-semaphore semaphores (limits, holders, waiters)."""


@semaphore.command(name="list", cls=CeleryCommand)
@click.option("--no-scan", is_flag=True, help="Do not SCAN Redis for semaphores.")
@_json_option
@click.pass_context
@_handle_errors
def list_(ctx: click.Context, /, no_scan: bool, as_json: bool, **_: Any) -> None:
    """Every known semaphore: limit and its source, units in use, waiters, partitions."""
    from . import cli_render, views

    ops = _Ops(ctx)
    rows = []
    for entry in ops.known(scan=not no_scan).values():
        rows.append(views.summary(entry, ops.semaphore(entry).inspect()))
    if as_json:
        _print_json(rows)
    else:
        click.echo(cli_render.listing(rows, ops.prefix))


@semaphore.command(cls=CeleryCommand)
@click.argument("name")
@_json_option
@click.pass_context
@_handle_errors
def show(ctx: click.Context, /, name: str, as_json: bool, **_: Any) -> None:
    """Holders and waiters of semaphore NAME."""
    from . import audit, cli_render, views

    ops = _Ops(ctx)
    entry = ops.entry(name)
    data = views.detail(entry, ops.semaphore(entry).inspect())
    data["operator_actions"] = audit.read(ops.client, ops.prefix, name, limit=5)
    if as_json:
        _print_json(data)
    else:
        click.echo(cli_render.detail(data))


@semaphore.command(cls=CeleryCommand)
@click.argument("task_id")
@click.option("--name", default=None, help="Look only at this semaphore.")
@_json_option
@click.pass_context
@_handle_errors
def explain(ctx: click.Context, /, task_id: str, name: str | None, as_json: bool, **_: Any) -> None:
    """Why task TASK_ID is not running: its place in line, what is ahead, the cap, an estimate."""
    from . import cli_render, views

    ops = _Ops(ctx)
    entries = [ops.entry(name)] if name is not None else list(ops.known().values())
    found = []
    for entry in entries:
        result = views.explain(entry, ops.semaphore(entry).inspect(), task_id)
        if result is not None:
            found.append(result)
    if not found:
        where = f"semaphore {name!r}" if name is not None else "any known semaphore"
        _fail(
            f"task {task_id} is neither holding nor waiting for {where} under key prefix "
            f"{ops.prefix!r}: it may still be in the broker's queue, be done already, or not "
            "be a limited task"
        )
    if as_json:
        _print_json(found)
    else:
        click.echo("\n\n".join(cli_render.explanation(r) for r in found))


@semaphore.command(name="set-limit", cls=CeleryCommand)
@click.argument("name")
@click.argument("limit", type=click.IntRange(min=1), required=False)
@click.option("--clear", is_flag=True, help="Remove the runtime limit override.")
@click.option(
    "--rate", "rates", multiple=True, metavar="N/PERIOD",
    help="Set a runtime rate (e.g. 10/s; repeat, or separate by commas, for several "
    "windows; 'none' clears it).",
)  # fmt: skip
@click.option("--clear-rate", is_flag=True, help="Remove the runtime rate override.")
@click.option(
    "--clear-throttle", is_flag=True,
    help="End a throttle pause and restore a lowered adaptive limit at once.",
)  # fmt: skip
@click.option(
    "--yes", is_flag=True, help="Do not ask for confirmation when a pattern matches several."
)
@click.option("--dry-run", is_flag=True, help="Only print the semaphores a pattern matches.")
@click.pass_context
@_handle_errors
def set_limit(
    ctx: click.Context,
    /,
    name: str,
    limit: int | None,
    clear: bool,
    rates: tuple[str, ...],
    clear_rate: bool,
    clear_throttle: bool,
    yes: bool,
    dry_run: bool,
    **_: Any,
) -> None:
    """Set a runtime limit for NAME that every worker obeys at once (or --clear it); with
    --rate, a runtime rate (or --clear-rate / --rate none to clear it); --clear-throttle ends
    a throttle pause and restores a limit lowered by adaptive throttling.

    NAME may be a glob pattern ('llm:*', 'db-?', 'shard-[0-9]'): every known semaphore it
    matches (as `list` finds them) is changed; when it matches several, it asks first unless
    --yes."""
    from . import actions

    if clear and limit is not None:
        raise click.UsageError("give either a LIMIT (an int >= 1) or --clear, not both")
    if clear_rate and rates:
        raise click.UsageError("give either --rate or --clear-rate, not both")
    change_rate = bool(rates) or clear_rate
    if not clear and limit is None and not change_rate and not clear_throttle:
        raise click.UsageError(
            "give a LIMIT (an int >= 1), --clear, --rate, --clear-rate or --clear-throttle"
        )
    new_rate = None
    if rates:
        try:  # the core's words: they name the parameter and the value; nothing is changed
            new_rate = actions.parse_rate(rates)
        except (TypeError, ValueError) as exc:
            _fail(f"{exc}; nothing changed", EXIT_USAGE)
    change_limit = clear or limit is not None
    ops = _Ops(ctx)
    entries = _matching(ops, name)
    whats = []
    if change_limit:
        whats.append("clear the runtime override of" if clear else f"set the limit to {limit} on")
    if change_rate:
        shown_rate = ", ".join(str(r) for r in new_rate) if new_rate is not None else None
        whats.append(
            f"set the rate to {shown_rate} on"
            if shown_rate is not None
            else "clear the runtime rate of"
        )
    if clear_throttle:
        whats.append("clear the throttle state of")
    what = " and ".join(w.removesuffix(" on").removesuffix(" of") for w in whats[:-1])
    what = (what + " and " if what else "") + whats[-1]
    if len(entries) > 1 or entries[0].name != name:
        shown = ", ".join(repr(e.name) for e in entries)
        click.echo(f"pattern {name!r} matches {len(entries)} semaphore(s): {shown}")
    if dry_run:
        click.echo(f"dry run: would {what} {len(entries)} semaphore(s); nothing changed")
        return
    if len(entries) > 1 and not yes:
        try:
            confirmed = click.confirm(
                f"{what.capitalize()} these {len(entries)} semaphores?", default=False
            )
        except click.Abort:
            confirmed = False
        if not confirmed:
            _fail("set-limit cancelled (use --yes to skip the question)", EXIT_CANCELLED)
    for entry in entries:
        sem = ops.semaphore(entry)
        if change_limit:
            _set_limit_one(ops, sem, entry, limit)
        if change_rate:
            _set_rate_one(ops, sem, entry, new_rate)
        if clear_throttle:
            cleared = actions.clear_throttle(ops.client, ops.prefix, sem)
            click.echo(
                f"semaphore {entry.name!r}: "
                + (
                    "throttle pause ended and lowered limit restored; waiters woken"
                    if cleared
                    else "nothing to clear (no throttle pause, no lowered limit)"
                )
            )


def _set_limit_one(ops: _Ops, sem: Any, entry: Any, limit: int | None) -> None:
    from . import actions

    before, after = actions.set_limit(ops.client, ops.prefix, sem, entry, limit)
    was = f"was {before['limit']} from {before['source']}"
    if limit is None:
        click.echo(
            f"semaphore {entry.name!r}: runtime override cleared ({was}); the limit is now "
            f"{after['limit'] if after['limit'] is not None else 'what each task declares'} "
            f"from {after['source']}"
        )
    else:
        click.echo(
            f"semaphore {entry.name!r}: limit set to {limit} (runtime override; {was}). "
            f"Every worker obeys it from its next acquire; it stays until "
            f"`celery semaphore set-limit {entry.name} --clear`."
        )


def _set_rate_one(ops: _Ops, sem: Any, entry: Any, rates: Any) -> None:
    from . import actions

    before, after = actions.set_rate(ops.client, ops.prefix, sem, rates)
    was = (
        f"was {before['rate']} from {_RATE_SOURCES[before['source']]}"
        if before["rate"] is not None
        else "there was no rate"
    )
    if rates is None:
        click.echo(
            f"semaphore {entry.name!r}: runtime rate cleared ({was}); the rate= the tasks "
            "declare applies again from their next acquire (none if they declare none)"
        )
    else:
        click.echo(
            f"semaphore {entry.name!r}: rate set to {after['rate']} (runtime override; "
            f"{was}). Every worker obeys it from its next acquire; it stays until "
            f"`celery semaphore set-limit {entry.name} --clear-rate`."
        )


#: where a rate in force comes from, in words (see :func:`.views.rate_info`)
_RATE_SOURCES = {"override": "a runtime override", "acquirers": "the tasks' rate="}


def _matching(ops: _Ops, name: str) -> list[Any]:
    """The Known entries ``name`` stands for: the semaphore of that exact name when one is
    known, else, for a glob pattern, every known semaphore it matches (exit 1 if none)."""
    import fnmatch

    from ..integration.patterns import is_pattern

    if not is_pattern(name):
        return [ops.entry(name)]
    known = ops.known()
    if name in known:
        return [known[name]]
    if ops.has_state(name):
        return [ops.entry(name)]
    matched = [entry for n, entry in known.items() if fnmatch.fnmatchcase(n, name)]
    if not matched:
        _fail(
            f"pattern {name!r} matches no known semaphore under key prefix {ops.prefix!r} "
            f"({len(known)} known; see `celery semaphore list`); nothing changed"
        )
    return matched


@semaphore.command(cls=CeleryCommand)
@click.argument("name")
@click.argument("token", required=False)
@click.option("--task-id", default=None, help="Release the permit(s) held by this task.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
@_handle_errors
def release(
    ctx: click.Context,
    /,
    name: str,
    token: str | None,
    task_id: str | None,
    yes: bool,
    **_: Any,
) -> None:
    """Force the release of a permit of NAME, by TOKEN or --task-id (asks first unless --yes;
    logged, with who did it).

    The task itself keeps running: its heartbeat then reports the permit released."""
    from . import actions, views

    if (token is None) == (task_id is None):
        raise click.UsageError("give either a TOKEN or --task-id ID, not both")
    ops = _Ops(ctx)
    entry = ops.entry(name)
    sem = ops.semaphore(entry)
    snap = sem.inspect()
    if token is not None:
        targets = [h for h in snap.holders if h.token == token]
        missing = f"no holder of semaphore {name!r} has token {token}"
    else:
        targets, waiting = views.find_task(snap, str(task_id))
        missing = f"task {task_id} holds no permit of semaphore {name!r}" + (
            f" (it is waiting, at position {waiting[0].position})" if waiting else ""
        )
    if not targets:
        _fail(f"{missing}; see `celery semaphore show {name}`")
    if not yes:
        units = sum(h.weight for h in targets)
        question = (
            f"Force-release {len(targets)} permit(s) ({units} unit(s)) of semaphore {name!r}? "
            "Their tasks keep running, so the semaphore may run over its limit until they end"
        )
        try:
            confirmed = click.confirm(question, default=False)
        except click.Abort:
            confirmed = False
        if not confirmed:
            _fail("release cancelled (use --yes to skip the question)", EXIT_CANCELLED)
    done = actions.force_release(ops.client, ops.prefix, sem, snap, targets)
    for holder, released in zip(targets, done, strict=True):
        what = "released" if released else "was already gone:"
        click.echo(
            f"semaphore {name!r}: {what} token {holder.token} (task "
            f"{holder.owner.get('task_id') or '?'}, {holder.weight} unit(s)); the task, if "
            "still running, keeps running and its heartbeat reports the permit released"
        )


@semaphore.command(cls=CeleryCommand)
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--forget", is_flag=True, help="Also remove NAME from the registry.")
@click.pass_context
@_handle_errors
def reset(ctx: click.Context, /, name: str, yes: bool, forget: bool, **_: Any) -> None:
    """Drop every holder and waiter of NAME (asks first unless --yes).

    Running tasks keep running (their heartbeat reports the permit released by the reset);
    waiting tasks are woken at once and queue again.  The runtime override and the fencing counter
    are kept."""
    from . import actions

    ops = _Ops(ctx)
    entry = ops.entry(name)
    sem = ops.semaphore(entry)
    snap = sem.inspect()
    question = (
        f"Reset semaphore {name!r}: drop {len(snap.holders)} holder(s) ({snap.used} unit(s)) "
        f"and {len(snap.waiters)} waiter(s)?"
    )
    if not yes:
        try:
            confirmed = click.confirm(question, default=False)
        except click.Abort:
            confirmed = False
        if not confirmed:
            _fail("reset cancelled (use --yes to skip the question)", EXIT_CANCELLED)
    result = actions.reset(ops.client, ops.prefix, sem, forget=forget)
    released, withdrawn, forgotten = result.released, result.withdrawn, result.forgot
    after = sem.inspect()
    kept = f"; runtime override {after.limit_override} kept" if after.limit_override else ""
    click.echo(
        f"semaphore {name!r} reset: released {released} holder(s), withdrew {withdrawn} "
        f"waiter(s); now {after.used} unit(s) in use, {len(after.waiters)} waiting{kept}"
        + ("; removed from the registry" if forgotten else "")
    )


@semaphore.command(cls=CeleryCommand)
@click.option(
    "--interval", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
    help="Seconds between refreshes.",
)  # fmt: skip
@click.option(
    "--iterations", type=click.IntRange(min=0), default=0, show_default=True,
    help="Stop after this many refreshes (0: until Ctrl-C).",
)  # fmt: skip
@click.option("--no-scan", is_flag=True, help="Do not SCAN Redis for semaphores.")
@_json_option
@click.pass_context
@_handle_errors
def top(
    ctx: click.Context, /, interval: float, iterations: int, no_scan: bool, as_json: bool, **_: Any
) -> None:
    """A live view: a bar per semaphore and partition, refreshed every second."""
    import sys
    import time

    from . import cli_render, views

    ops = _Ops(ctx)
    live = sys.stdout.isatty() and not as_json
    frame = 0
    entries: dict[str, Any] = {}
    try:
        while iterations == 0 or frame < iterations:
            started = time.monotonic()
            if frame % 30 == 0:  # look for new semaphores now and then, not every second
                entries = ops.known(scan=not no_scan)
            rows = [views.summary(e, ops.semaphore(e).inspect()) for e in entries.values()]
            if as_json:
                click.echo(json.dumps({"at": time.time(), "semaphores": rows}, default=str))
            else:
                text = cli_render.top_frame(rows, ops.prefix, interval)
                if live:
                    click.clear()
                elif frame:
                    click.echo("")
                click.echo(text)
            frame += 1
            if iterations == 0 or frame < iterations:
                time.sleep(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        return


@semaphore.command(name="audit", cls=CeleryCommand)
@click.argument("name", required=False)
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
@_json_option
@click.pass_context
@_handle_errors
def audit_(ctx: click.Context, /, name: str | None, limit: int, as_json: bool, **_: Any) -> None:
    """Recent operator actions (forced releases, resets, runtime limits): who, when, what."""
    from . import audit, cli_render

    ops = _Ops(ctx)
    entries = audit.read(ops.client, ops.prefix, name, limit=limit)
    if as_json:
        _print_json(entries)
    elif not entries:
        click.echo("no operator actions recorded" + (f" for {name!r}" if name else ""))
    else:
        click.echo(cli_render.audit_lines(entries))


@semaphore.command(cls=CeleryCommand)
@click.option("--port", type=click.IntRange(1, 65535), default=9808, show_default=True)
@click.option("--address", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--no-scan", is_flag=True, help="Do not SCAN Redis for semaphores at scrapes.")
@click.pass_context
@_handle_errors
def metrics(ctx: click.Context, /, port: int, address: str, no_scan: bool, **_: Any) -> None:
    """Serve Prometheus metrics (gauges read from Redis; needs the [prometheus] extra).

    With PROMETHEUS_MULTIPROC_DIR set to the workers' directory (same host), it also serves
    their counters and histograms."""
    import time

    ops = _Ops(ctx)
    ops.client  # noqa: B018 - fail now (exit 3) if Redis is unreachable
    try:
        from . import metrics as metrics_mod
    except ImportError as exc:
        _fail(str(exc), EXIT_USAGE)
    try:
        metrics_mod.start_exporter(ops.app, port=port, address=address, scan=not no_scan)
    except OSError as exc:
        _fail(f"cannot listen on {address}:{port}: {exc}", EXIT_USAGE)
    click.echo(f"serving celery-semaphore metrics on http://{address}:{port}/metrics")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return


# `serve` and `held` live in their own module
from .cli_web import held as _held  # noqa: E402
from .cli_web import serve as _serve  # noqa: E402

semaphore.add_command(_serve)
semaphore.add_command(_held)
