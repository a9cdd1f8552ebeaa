"""The commands that only read: ``list``, ``show``, ``explain``, ``top``, ``audit`` (from
Redis) and ``held`` (from the workers).  :mod:`.cli` adds them to its ``semaphore`` group."""

from __future__ import annotations

import json
import shlex
from typing import Any

import click
from celery.bin.base import CeleryCommand

from .cli_common import (
    EXIT_NOT_FOUND,
    Ops,
    app_of,
    fail,
    handle_errors,
    json_option,
    print_json,
)

__all__ = ["audit_", "explain", "held", "list_", "show", "top"]


#: how many semaphores ``list`` shows at a time by default
LIST_PAGE = 100


@click.command(name="list", cls=CeleryCommand)
@click.option("--no-scan", is_flag=True, help="Do not SCAN Redis for semaphores.")
@click.option(
    "--limit", type=click.IntRange(min=0), default=LIST_PAGE, show_default=True,
    help="Show at most this many semaphores, by name (0: all of them).",
)  # fmt: skip
@click.option(
    "--after", default=None, metavar="NAME",
    help="Start after this name (the next page: the last name shown).",
)  # fmt: skip
@json_option
@click.pass_context
@handle_errors
def list_(
    ctx: click.Context,
    /,
    no_scan: bool,
    limit: int,
    after: str | None,
    as_json: bool,
    **_: Any,
) -> None:
    """Every known semaphore: limit and its source, units in use, waiters, partitions.  A
    page at a time (--limit, --after)."""
    from . import cli_render, registry, views

    ops = Ops(ctx)
    known = ops.known(scan=not no_scan)
    entries, more = registry.page(known, limit or None, after)
    rows = [views.summary(entry, ops.semaphore(entry).inspect()) for entry in entries]
    if as_json:
        print_json(rows)
    else:
        click.echo(cli_render.listing(rows, ops.prefix))
    if more:
        last = entries[-1].name
        click.echo(
            f"showing {len(rows)} of {len(known)} semaphores; the next page: "
            f"celery semaphore list --after {shlex.quote(last)} (--limit 0: all)",
            err=as_json,
        )


@click.command(cls=CeleryCommand)
@click.argument("name")
@json_option
@click.pass_context
@handle_errors
def show(ctx: click.Context, /, name: str, as_json: bool, **_: Any) -> None:
    """Holders and waiters of semaphore NAME."""
    from . import audit, cli_render, views

    ops = Ops(ctx)
    entry = ops.entry(name)
    data = views.detail(entry, ops.semaphore(entry).inspect())
    data["operator_actions"] = audit.read(ops.client, ops.prefix, name, limit=5)
    data["line_policies"] = views.line_policies(ops.app, data["tasks"])
    if as_json:
        print_json(data)
    else:
        click.echo(cli_render.detail(data))


@click.command(cls=CeleryCommand)
@click.argument("task_id")
@click.option("--name", default=None, help="Look only at this semaphore.")
@json_option
@click.pass_context
@handle_errors
def explain(ctx: click.Context, /, task_id: str, name: str | None, as_json: bool, **_: Any) -> None:
    """Why task TASK_ID is not running: its place in line, what is ahead, the cap, an estimate."""
    from ..logs import printable
    from . import cli_render, views

    ops = Ops(ctx)
    entries = [ops.entry(name)] if name is not None else list(ops.known().values())
    found = []
    for entry in entries:
        result = views.explain(entry, ops.semaphore(entry).inspect(), task_id)
        if result is not None:
            found.append(result)
    if not found:
        where = f"semaphore {name!r}" if name is not None else "any known semaphore"
        fail(
            f"task {printable(task_id)} is neither holding nor waiting for {where} under key "
            f"prefix {ops.prefix!r}: it may still be in the broker's queue, be done already, or "
            "not be a limited task"
        )
    if as_json:
        print_json(found)
    else:
        click.echo("\n\n".join(cli_render.explanation(r) for r in found))


@click.command(cls=CeleryCommand)
@click.option(
    "--interval", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
    help="Seconds between refreshes.",
)  # fmt: skip
@click.option(
    "--iterations", type=click.IntRange(min=0), default=0, show_default=True,
    help="Stop after this many refreshes (0: until Ctrl-C).",
)  # fmt: skip
@click.option("--no-scan", is_flag=True, help="Do not SCAN Redis for semaphores.")
@json_option
@click.pass_context
@handle_errors
def top(
    ctx: click.Context, /, interval: float, iterations: int, no_scan: bool, as_json: bool, **_: Any
) -> None:
    """A live view: a bar per semaphore and partition, refreshed every second."""
    import sys
    import time

    from . import cli_render, views

    ops = Ops(ctx)
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


@click.command(name="audit", cls=CeleryCommand)
@click.argument("name", required=False)
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
@json_option
@click.pass_context
@handle_errors
def audit_(ctx: click.Context, /, name: str | None, limit: int, as_json: bool, **_: Any) -> None:
    """Recent operator actions (forced releases, resets, runtime limits): who, when, what."""
    from . import audit, cli_render

    ops = Ops(ctx)
    entries = audit.read(ops.client, ops.prefix, name, limit=limit)
    if as_json:
        print_json(entries)
    elif not entries:
        click.echo("no operator actions recorded" + (f" for {name!r}" if name else ""))
    else:
        click.echo(cli_render.audit_lines(entries))


@click.command(cls=CeleryCommand)
@click.option(
    "-d", "--destination", multiple=True,
    help="Ask only this worker node (repeat for more); default: every worker.",
)  # fmt: skip
@click.option(
    "-t", "--timeout", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
    help="Seconds to wait for the workers' replies.",
)  # fmt: skip
@json_option
@click.pass_context
@handle_errors
def held(
    ctx: click.Context, /, destination: tuple[str, ...], timeout: float, as_json: bool, **_: Any
) -> None:
    """The tasks each worker's gate holds off the pool, waiting for a permit (they are not in
    `celery inspect reserved`)."""
    from .worker_hooks import HELD_COMMAND

    app = app_of(ctx)
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
        fail(
            f"no worker replied within {timeout}s (is one running, with this app's broker?)",
            EXIT_NOT_FOUND,
        )
    if as_json:
        print_json(by_node)
    else:
        click.echo(_held_lines(by_node))


def _held_lines(by_node: dict[str, Any]) -> str:
    """Each worker's held tasks, as a table per worker."""
    from . import cli_render

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
    return "\n".join(lines)
