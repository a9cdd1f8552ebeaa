"""The commands that serve until Ctrl-C: ``serve`` (the operator's web page) and ``metrics``
(the standalone Prometheus exporter).  :mod:`.cli` adds them to its ``semaphore`` group."""

from __future__ import annotations

from typing import Any

import click
from celery.bin.base import CeleryCommand

from .cli_common import EXIT_USAGE, Ops, fail, handle_errors

__all__ = ["metrics", "serve"]


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
@handle_errors
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

    from . import web

    if token is not None and not allow_actions:
        raise click.UsageError("--token is only used with --allow-actions")
    ops = Ops(ctx)
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
        fail(f"cannot listen on {address}:{port}: {exc}", EXIT_USAGE)
    shown = f"[{address}]" if ":" in address else address
    click.echo(f"serving the celery-semaphore page on http://{shown}:{port}/")
    if not allow_actions:
        click.echo("read-only: actions are off (see --allow-actions)")
    elif generated:
        click.echo(f"actions allowed with the token: {token}")
    else:
        click.echo("actions allowed with the given token")
    _wait_for_ctrl_c()
    server.shutdown()


@click.command(cls=CeleryCommand)
@click.option("--port", type=click.IntRange(1, 65535), default=9808, show_default=True)
@click.option("--address", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--no-scan", is_flag=True, help="Do not SCAN Redis for semaphores at scrapes.")
@click.pass_context
@handle_errors
def metrics(ctx: click.Context, /, port: int, address: str, no_scan: bool, **_: Any) -> None:
    """Serve Prometheus metrics (gauges read from Redis; needs the [prometheus] extra).

    With PROMETHEUS_MULTIPROC_DIR set to the workers' directory (same host), it also serves
    their counters and histograms."""
    ops = Ops(ctx)
    ops.client  # noqa: B018 - fail now (exit 3) if Redis is unreachable
    try:
        from . import metrics as metrics_mod
    except ImportError as exc:
        fail(str(exc), EXIT_USAGE)
    try:
        metrics_mod.start_exporter(ops.app, port=port, address=address, scan=not no_scan)
    except OSError as exc:
        fail(f"cannot listen on {address}:{port}: {exc}", EXIT_USAGE)
    click.echo(f"serving celery-semaphore metrics on http://{address}:{port}/metrics")
    _wait_for_ctrl_c()


def _wait_for_ctrl_c() -> None:
    """Sleep while the server threads serve; return at Ctrl-C."""
    import time

    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return
