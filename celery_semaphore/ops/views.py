"""What the operator tools show: a semaphore's state as plain, JSON-ready dicts.

The CLI (:mod:`celery_semaphore.ops.cli`) renders these as text or prints them with ``--json``;
the metrics collector (:mod:`celery_semaphore.ops.metrics`) reads the same summaries.  Everything
is read through the core's public inspection API (:meth:`Semaphore.inspect`), one round trip
per semaphore, on the Redis server's clock.

Partitions (per-queue shares) are shown when the core reports them
(``Snapshot.partitions``, ``HolderInfo.partition``, ``WaiterInfo.partition``); until then the
fields are empty.

Rate windows (``Snapshot.rates``) are shown as ``rates``: each window's count and period, the
weight started in it, what is still available and when it next has room.  Besides HOW a waiter
waits (:func:`how_waiting`), a waiter may carry WHY it waits when that is not the ordinary
reason (units in use, or its turn in line): ``why`` is None then, or a dict whose ``kind``
names the reason, ``text`` says it in words and ``ends_in`` says when it ends (seconds, None
when unknown).  Two kinds: ``"rate"`` (:data:`RATE`), the head of a line whose weight fits the
free units, but not the room left in some rate window; and ``"pause"`` (:data:`PAUSE`), such a
head while a throttle pause (``Semaphore.throttled(retry_after=...)``) holds every new grant.

Besides ``why`` (kept as it was), every waiter carries ``reason``: why it waits, whatever it
is, in the one vocabulary of :mod:`.views_reason` (units, a partition's cap, a rate window, an
adaptive pause, or nothing: it is starting); ``summary`` counts the waiters by reason
(``waiting_by_reason``).

Limits that follow the downstream service (``Semaphore(adaptive=True)``) are shown as
``effective`` (:func:`effective_info`): the units that may be held now (an adaptive limit
below the limit in force), the pause, the throttles so far, and in words why the effective
limit is lower.  Free units (``available``, and the checks above) count from the effective
limit.

The pieces live in :mod:`.views_state` (the limit, the rate, holders, how a waiter waits),
:mod:`.views_why` (why a waiter waits) and :mod:`.views_explain` (``explain``); this module
puts them together for ``list``/``top`` (:func:`summary`) and ``show`` (:func:`detail`), and
is where the other modules and the tests find every public name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..core.semaphore import Semaphore, Snapshot
from .registry import Known
from .views_explain import explain
from .views_reason import (
    CAP,
    REASONS,
    STARTING,
    UNITS,
    reason_label,
    waiter_reasons,
    waiting_by_reason,
)
from .views_state import (
    BLOCKED,
    HELD,
    PARKED,
    SLOT,
    STANDBY,
    effective_info,
    find_task,
    holder_info,
    how_waiting,
    limit_info,
    partitions,
    rate_info,
    rate_windows,
    seconds_text,
)
from .views_why import PAUSE, RATE, held_by, held_by_pause, held_by_rate, waiter_info

__all__ = [
    "BLOCKED",
    "CAP",
    "HELD",
    "PARKED",
    "PAUSE",
    "RATE",
    "REASONS",
    "SLOT",
    "STANDBY",
    "STARTING",
    "UNITS",
    "detail",
    "effective_info",
    "explain",
    "find_task",
    "held_by",
    "held_by_pause",
    "held_by_rate",
    "how_waiting",
    "limit_info",
    "rate_info",
    "rate_windows",
    "reason_label",
    "seconds_text",
    "semaphore_for_known",
    "summary",
    "waiter_reasons",
    "waiting_by_reason",
]


def semaphore_for_known(
    client: Any,
    prefix: str,
    entry: Known,
    hash_tag: str | None = None,
    on_wake: Callable[[str, str], None] | None = None,
) -> Semaphore:
    """A Semaphore object to read (or operate on) ``entry``.  Its limit is the configured one
    (a runtime override in Redis wins anyway); 1 when nothing is known.  ``hash_tag``: the
    app's ``semaphore_hash_tag`` (the keys live under it).  ``on_wake``: how its releases
    and withdrawals wake tasks held by a worker or parked in the broker."""
    return Semaphore(
        entry.name,
        entry.configured_limit or 1,
        redis=client,
        key_prefix=prefix,
        hash_tag=hash_tag,
        on_wake=on_wake,
    )


def summary(entry: Known, snap: Snapshot) -> dict[str, Any]:
    """One line of ``list`` / ``top``: limit and source, units in use, holders, waiters, the
    effective limit (:func:`effective_info`; ``available`` counts from it) and the rate."""
    info = limit_info(entry, snap)
    effective = effective_info(snap, info["limit"])
    oldest = max((snap.server_time - w.waiting_since for w in snap.waiters), default=0.0)
    return {
        "name": entry.name,
        **info,
        "effective": effective,
        "used": snap.used,
        "available": max(0, (effective["limit"] or 0) - snap.used),
        "holders": len(snap.holders),
        "waiting": len(snap.waiters),
        "waiting_by_reason": waiting_by_reason(waiter_reasons(snap, effective["limit"])),
        "oldest_wait": round(oldest, 3),
        "hold_time_avg": None if snap.hold_time_avg is None else round(snap.hold_time_avg, 3),
        "reclaimed_total": snap.reclaimed_total,
        "died_total": snap.died_total,
        "full_total": snap.full_total,
        "dropped_total": snap.dropped_total,
        "grants_total": snap.grants_total,
        "tasks": sorted(entry.tasks),
        "partitions": partitions(snap),
        "rates": rate_windows(snap),
        "rate": rate_info(snap),
        "found_in": sorted(entry.found_in),
        "recorded_by": entry.node,
        "recorded_at": entry.recorded_at,
    }


def detail(entry: Known, snap: Snapshot) -> dict[str, Any]:
    """``show NAME``: the summary plus every holder and waiter."""
    now = snap.server_time
    row = summary(entry, snap)
    limit = row["effective"]["limit"] or 0
    reasons = waiter_reasons(snap, row["effective"]["limit"])
    return {
        **row,
        "server_time": now,
        "holder_list": [holder_info(h, now) for h in snap.holders],
        "waiter_list": [waiter_info(w, now, snap, limit, reasons) for w in snap.waiters],
    }


def line_policies(app: Any, tasks: Sequence[str]) -> list[dict[str, Any]]:
    """What each of ``tasks`` (this app's, by name) does when the line is full, for those
    with a bound or a priority: task, priority (``"per call"`` for a callable),
    max_waiting, on_full."""
    from ..integration.decorators import spec_of

    out = []
    for name in tasks:
        task = app.tasks.get(name) if app is not None else None
        spec = None if task is None else spec_of(task)
        if spec is None or (spec.priority, spec.max_waiting) == (0, None):
            continue
        priority = "per call" if callable(spec.priority) else spec.priority
        row = {"task": name, "priority": priority, "max_waiting": spec.max_waiting}
        out.append({**row, "on_full": spec.on_full})
    return out
