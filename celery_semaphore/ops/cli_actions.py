"""The operator's actions: ``set-limit`` (runtime limit, rate, throttle state), ``release``
(a forced release) and ``reset``.  Each asks first when it could surprise (several semaphores,
a running task's permit, every holder) and is logged with who did it (:mod:`.audit`).
:mod:`.cli` adds them to its ``semaphore`` group."""

from __future__ import annotations

from typing import Any

import click
from celery.bin.base import CeleryCommand

from .cli_common import EXIT_USAGE, Ops, confirm_or_cancel, fail, handle_errors

__all__ = ["release", "reset", "set_limit"]

#: where a rate in force comes from, in words (see :func:`.views.rate_info`)
_RATE_SOURCES = {"override": "a runtime override", "acquirers": "the tasks' rate="}


@click.command(name="set-limit", cls=CeleryCommand)
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
@handle_errors
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
    new_rate = _new_rate(limit, clear, rates, clear_rate, clear_throttle)
    change_limit = clear or limit is not None
    change_rate = bool(rates) or clear_rate
    ops = Ops(ctx)
    entries = _matching(ops, name)
    what = _what(limit, clear, change_rate, new_rate, clear_throttle)
    if len(entries) > 1 or entries[0].name != name:
        shown = ", ".join(repr(e.name) for e in entries)
        click.echo(f"pattern {name!r} matches {len(entries)} semaphore(s): {shown}")
    if dry_run:
        click.echo(f"dry run: would {what} {len(entries)} semaphore(s); nothing changed")
        return
    if len(entries) > 1 and not yes:
        confirm_or_cancel(f"{what.capitalize()} these {len(entries)} semaphores?", "set-limit")
    for entry in entries:
        sem = ops.semaphore(entry)
        if change_limit:
            _set_limit_one(ops, sem, entry, limit)
        if change_rate:
            _set_rate_one(ops, sem, entry, new_rate)
        if clear_throttle:
            _clear_throttle_one(ops, sem, entry)


def _new_rate(
    limit: int | None, clear: bool, rates: tuple[str, ...], clear_rate: bool, clear_throttle: bool
) -> Any:
    """Check that set-limit's options ask for one consistent change (else a usage error) and
    return the rate windows ``--rate`` gives (None: none given, or cleared)."""
    from . import actions

    if clear and limit is not None:
        raise click.UsageError("give either a LIMIT (an int >= 1) or --clear, not both")
    if clear_rate and rates:
        raise click.UsageError("give either --rate or --clear-rate, not both")
    if not clear and limit is None and not rates and not clear_rate and not clear_throttle:
        raise click.UsageError(
            "give a LIMIT (an int >= 1), --clear, --rate, --clear-rate or --clear-throttle"
        )
    if not rates:
        return None
    try:  # the core's words: they name the parameter and the value; nothing is changed
        return actions.parse_rate(rates)
    except (TypeError, ValueError) as exc:
        fail(f"{exc}; nothing changed", EXIT_USAGE)


def _what(
    limit: int | None, clear: bool, change_rate: bool, new_rate: Any, clear_throttle: bool
) -> str:
    """What set-limit is about to do, in words (``set the limit to 3 and the rate to 2/s on``),
    for the dry run and the question."""
    whats = []
    if clear or limit is not None:
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
    return (what + " and " if what else "") + whats[-1]


def _set_limit_one(ops: Ops, sem: Any, entry: Any, limit: int | None) -> None:
    from ..logs import printable
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
            f"`celery semaphore set-limit {printable(entry.name)} --clear`."
        )


def _set_rate_one(ops: Ops, sem: Any, entry: Any, rates: Any) -> None:
    from ..logs import printable
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
            f"`celery semaphore set-limit {printable(entry.name)} --clear-rate`."
        )


def _clear_throttle_one(ops: Ops, sem: Any, entry: Any) -> None:
    from . import actions

    cleared = actions.clear_throttle(ops.client, ops.prefix, sem)
    click.echo(
        f"semaphore {entry.name!r}: "
        + (
            "throttle pause ended and lowered limit restored; waiters woken"
            if cleared
            else "nothing to clear (no throttle pause, no lowered limit)"
        )
    )


def _matching(ops: Ops, name: str) -> list[Any]:
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
        fail(
            f"pattern {name!r} matches no known semaphore under key prefix {ops.prefix!r} "
            f"({len(known)} known; see `celery semaphore list`); nothing changed"
        )
    return matched


@click.command(cls=CeleryCommand)
@click.argument("name")
@click.argument("token", required=False)
@click.option("--task-id", default=None, help="Release the permit(s) held by this task.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
@handle_errors
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
    from ..logs import printable
    from . import actions, views

    if (token is None) == (task_id is None):
        raise click.UsageError("give either a TOKEN or --task-id ID, not both")
    ops = Ops(ctx)
    entry = ops.entry(name)
    sem = ops.semaphore(entry)
    snap = sem.inspect()
    if token is not None:
        targets = [h for h in snap.holders if h.token == token]
        missing = f"no holder of semaphore {name!r} has token {printable(token)}"
    else:
        targets, waiting = views.find_task(snap, str(task_id))
        missing = f"task {printable(task_id)} holds no permit of semaphore {name!r}" + (
            f" (it is waiting, at position {waiting[0].position})" if waiting else ""
        )
    if not targets:
        fail(f"{missing}; see `celery semaphore show {printable(name)}`")
    if not yes:
        units = sum(h.weight for h in targets)
        confirm_or_cancel(
            f"Force-release {len(targets)} permit(s) ({units} unit(s)) of semaphore {name!r}? "
            "Their tasks keep running, so the semaphore may run over its limit until they end",
            "release",
        )
    done = actions.force_release(ops.client, ops.prefix, sem, snap, targets)
    for holder, released in zip(targets, done, strict=True):
        what = "released" if released else "was already gone:"
        click.echo(
            f"semaphore {name!r}: {what} token {printable(holder.token)} (task "
            f"{printable(holder.owner.get('task_id') or '?')}, {holder.weight} unit(s)); the "
            "task, if still running, keeps running and its heartbeat reports the permit released"
        )


@click.command(cls=CeleryCommand)
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--forget", is_flag=True, help="Also remove NAME from the registry.")
@click.pass_context
@handle_errors
def reset(ctx: click.Context, /, name: str, yes: bool, forget: bool, **_: Any) -> None:
    """Drop every holder and waiter of NAME (asks first unless --yes).

    Running tasks keep running (their heartbeat reports the permit released by the reset);
    waiting tasks are woken at once and queue again.  The runtime override and the fencing counter
    are kept."""
    from . import actions

    ops = Ops(ctx)
    entry = ops.entry(name)
    sem = ops.semaphore(entry)
    snap = sem.inspect()
    if not yes:
        confirm_or_cancel(
            f"Reset semaphore {name!r}: drop {len(snap.holders)} holder(s) ({snap.used} unit(s)) "
            f"and {len(snap.waiters)} waiter(s)?",
            "reset",
        )
    result = actions.reset(ops.client, ops.prefix, sem, forget=forget)
    released, withdrawn, forgotten = result.released, result.withdrawn, result.forgot
    after = sem.inspect()
    kept = f"; runtime override {after.limit_override} kept" if after.limit_override else ""
    click.echo(
        f"semaphore {name!r} reset: released {released} holder(s), withdrew {withdrawn} "
        f"waiter(s); now {after.used} unit(s) in use, {len(after.waiters)} waiting{kept}"
        + ("; removed from the registry" if forgotten else "")
    )
