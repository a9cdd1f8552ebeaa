"""``celery semaphore serve`` (the operator's web page) and ``celery semaphore held`` (the
requests each worker's gate holds).  :mod:`.cli` adds them to its ``semaphore`` group; they use
its error handling and exit codes (imported when they run: this module imports nothing from
:mod:`.cli`, which imports it), and like it import nothing heavy at module level."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar

import click
from celery.bin.base import CeleryCommand

__all__ = ["held", "serve"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _handle_errors(fn: _F) -> _F:
    """:func:`.cli._handle_errors`, looked up when the command runs."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from .cli import _handle_errors as handle

        return handle(fn)(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


@click.command(cls=CeleryCommand)
@click.option("--port", type=click.IntRange(1, 65535), default=5580, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--allow-actions", is_flag=True,
    help="Allow set-limit, reset and release from the page (each needs the token).",
)  # fmt: skip
@click.option(
    "--token", default=None,
    help="The actions' token (default: $CELERY_SEMAPHORE_WEB_TOKEN, else a random one, printed).",
)  # fmt: skip
@click.option("--no-scan", is_flag=True, help="Do not SCAN Redis for semaphores.")
@click.pass_context
@_handle_errors
def serve(
    ctx: click.Context,
    /,
    port: int,
    address: str,
    allow_actions: bool,
    token: str | None,
    no_scan: bool,
    **_: Any,
) -> None:
    """Serve the operator's web page: every semaphore, its holders and waiters, live.

    Read-only unless --allow-actions; then set-limit, reset and release each need the token
    (--token, or CELERY_SEMAPHORE_WEB_TOKEN, else a random one printed here) and are logged
    with who did it, like the CLI's."""
    import os
    import secrets
    import time

    from . import web
    from .cli import EXIT_USAGE, _fail, _Ops

    if token is not None and not allow_actions:
        raise click.UsageError("--token is only used with --allow-actions")
    ops = _Ops(ctx)
    ops.client  # noqa: B018 - fail now (exit 3) if Redis is unreachable
    generated = False
    if allow_actions:
        token = token or os.environ.get(web.TOKEN_ENV) or None
        if token is None:
            token, generated = secrets.token_urlsafe(24), True
    try:
        server, _thread = web.start_server(
            ops.app, port=port, address=address, scan=not no_scan, token=token
        )
    except OSError as exc:
        _fail(f"cannot listen on {address}:{port}: {exc}", EXIT_USAGE)
    shown = f"[{address}]" if ":" in address else address
    click.echo(f"serving the celery-semaphore page on http://{shown}:{port}/")
    if not allow_actions:
        click.echo("read-only: actions are off (see --allow-actions)")
    elif generated:
        click.echo(f"actions allowed with the token: {token}")
    else:
        click.echo("actions allowed with the given token")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()
        return


@click.command(cls=CeleryCommand)
@click.option(
    "-d", "--destination", multiple=True,
    help="Ask only this worker node (repeat for more); default: every worker.",
)  # fmt: skip
@click.option(
    "-t", "--timeout", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
    help="Seconds to wait for the workers' replies.",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
@click.pass_context
@_handle_errors
def held(
    ctx: click.Context, /, destination: tuple[str, ...], timeout: float, as_json: bool, **_: Any
) -> None:
    """The tasks each worker's gate holds off the pool, waiting for a permit (they are not in
    `celery inspect reserved`)."""
    from . import cli_render
    from .cli import EXIT_NOT_FOUND, EXIT_USAGE, _fail
    from .worker_hooks import HELD_COMMAND

    app = ctx.find_root().obj.app if ctx.find_root().obj is not None else None
    if app is None:
        _fail("no Celery app: run it as `celery -A proj semaphore ...`", EXIT_USAGE)
    replies = app.control.broadcast(
        HELD_COMMAND,
        reply=True,
        timeout=timeout,
        destination=list(destination) or None,
    )
    by_node: dict[str, Any] = {}
    for reply in replies or []:
        by_node.update(reply)
    if not by_node:
        _fail(
            f"no worker replied within {timeout}s (is one running, with this app's broker?)",
            EXIT_NOT_FOUND,
        )
    if as_json:
        click.echo(json.dumps(by_node, indent=2, sort_keys=True, default=str))
        return
    lines = []
    for node, tasks in sorted(by_node.items()):
        if isinstance(tasks, dict) and "error" in tasks:
            # a worker whose celery-semaphore has no such command answers with an error
            lines.append(f"{node}: cannot tell ({tasks['error']})")
            continue
        lines.append(f"{node}: {len(tasks)} task(s) held by the gate")
        if tasks:
            lines.append(
                cli_render.table(
                    ["TASK ID", "TASK", "SEMAPHORE", "STAGE", "POSITION", "HELD FOR", "RESERVED"],
                    [
                        [
                            t["task_id"],
                            t["task"],
                            t["semaphore"],
                            t["stage"],
                            t["position"],
                            cli_render.duration(t["waited"]),
                            # past semaphore_worker_hold, a held task stays in the prefetch
                            # window: `celery inspect reserved` lists it too
                            not t["counted"],
                        ]
                        for t in tasks
                    ],
                    indent="  ",
                )
            )
    click.echo("\n".join(lines))
