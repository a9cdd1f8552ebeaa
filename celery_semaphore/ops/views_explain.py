"""``celery semaphore explain TASK_ID``: why a task is (not) running on a semaphore, its place
in line, what is ahead, the cap that applies and a rough estimate of when it starts.
:mod:`.views` re-exports :func:`explain`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.semaphore import Snapshot, WaiterInfo
from .registry import Known
from .views_reason import STARTING, waiter_reasons
from .views_state import (
    effective_info,
    find_task,
    holder_info,
    limit_info,
    partitions,
    rate_info,
    rate_windows,
    seconds_text,
)
from .views_why import PAUSE, held_by, waiter_info

__all__ = ["explain"]


def explain(entry: Known, snap: Snapshot, task_id: str) -> dict[str, Any] | None:
    """Why task ``task_id`` is (not) running on this semaphore; None if it is not there."""
    held, waiting = find_task(snap, task_id)
    if not held and not waiting:
        return None
    info = limit_info(entry, snap)
    effective = effective_info(snap, info["limit"])
    out: dict[str, Any] = {
        "name": entry.name,
        "task_id": task_id,
        **info,
        "effective": effective,
        "rate": rate_info(snap),
        "used": snap.used,
    }
    if held:
        out.update(state="holding", holding=[holder_info(h, snap.server_time) for h in held])
    else:
        out.update(state="waiting", **_waiting(snap, waiting[0], info, effective))
    out["sentence"] = _sentence(out)
    return out


def _sentence(r: Mapping[str, Any]) -> str:
    """``explain``'s first line: in one sentence, why the task waits (or that it holds)."""
    if r["state"] == "holding":
        h = r["holding"][0]
        return (
            f"task {r['task_id']} ({h['task'] or '?'}) holds semaphore {r['name']!r}: it is "
            "not waiting for it."
        )
    w, reason = r["waiter"], r["reason"]
    who = f"task {r['task_id']} ({w['task'] or '?'})"
    if reason["kind"] == STARTING:
        return f"{who} waits for semaphore {r['name']!r}, but {reason['because']}."
    return f"{who} waits for semaphore {r['name']!r} because {reason['because']}."


def _waiting(
    snap: Snapshot, me: WaiterInfo, info: Mapping[str, Any], effective: Mapping[str, Any]
) -> dict[str, Any]:
    """``explain``'s fields for a waiting task: its line, the units, the cap, the estimate."""
    now = snap.server_time
    # positions count within the waiter's partition (one line when there are none)
    mine = getattr(me, "partition", None)
    ahead = [
        w
        for w in snap.waiters
        if w.position < me.position and getattr(w, "partition", None) == mine
    ]
    ahead_units = sum(w.weight for w in ahead)
    limit = effective["limit"] or 0  # a lowered (adaptive) limit is what turns over
    free = max(0, limit - snap.used)
    # units that must come free (be released) before this task's turn
    needed = max(0, ahead_units + me.weight - free)
    hold, basis = _hold_estimate(snap)
    reasons = waiter_reasons(snap, effective["limit"])
    waiter = waiter_info(me, now, snap, limit, reasons)
    why = waiter["why"]
    head = next((w for w in ahead if w.position == 0), None)
    if why is not None:
        estimate: float | None
        estimate, basis = _held_estimate(snap, me.weight, why)
    else:
        estimate, basis = _turn_estimate(
            snap,
            starts=ahead_units + me.weight,
            needed=needed,
            limit=limit,
            hold=hold,
            pause=effective["paused_for"],
            basis=basis,
        )
    return {
        "waiter": waiter,
        "reason": waiter["reason"],
        "why": why,
        "head_why": None if head is None else held_by(snap, head, limit),
        "rates": rate_windows(snap),
        "ahead": [waiter_info(w, now, snap, limit, reasons) for w in ahead],
        "ahead_units": ahead_units,
        "free": free,
        "needed": needed,
        "cap": _cap(snap, me, info),
        "holders": [holder_info(h, now) for h in snap.holders],
        "estimate": None if estimate is None else round(estimate, 1),
        "estimate_basis": basis,
        "hold_estimate": None if hold is None else round(hold, 3),
    }


def _held_estimate(snap: Snapshot, weight: int, why: Mapping[str, Any]) -> tuple[float, str]:
    """When a waiter whose units are free, but which a throttle pause or the rate holds
    (``why``, :func:`.views_why.held_by`), starts; and how that was found."""
    estimate: float = why["ends_in"]
    if why["kind"] == PAUSE:
        basis = "its units are free: it starts when the throttle pause ends"
        if why["rate"] is not None:
            basis += f" and the rate {why['rate']['rate']} has room"
        return estimate, basis
    basis = f"its units are free: it starts when the rate {why['rate']} has room"
    if why["at_least"]:
        basis += f" for its weight {weight}"
        by_rate = _rate_estimate(snap, weight)
        if by_rate is not None and by_rate[0] > estimate:
            estimate = min(by_rate[0], why["ends_within"])
            basis += ", roughly at the window's pace"
    return estimate, basis


def _turn_estimate(
    snap: Snapshot,
    *,
    starts: int,
    needed: int,
    limit: int,
    hold: float | None,
    pause: float | None,
    basis: str,
) -> tuple[float | None, str]:
    """When a waiter that waits for units (or its turn) starts: ``needed`` units must come
    free of ``limit``, each held about ``hold`` seconds (how that was found: ``basis``), and
    ``starts`` starts up to and including its own need room in the rate; nobody starts
    before a throttle pause (``pause`` seconds) ends.  The estimate and how it was found."""
    if needed == 0:
        estimate: float | None = 0.0
        basis = "its units are free now: it runs as soon as it is woken or its copy arrives"
    elif hold is None or limit <= 0:
        estimate = None
    else:  # `limit` units turn over every `hold` seconds
        estimate = needed * hold / limit
    # the units are not all: the starts up to its own need room in every rate window
    by_rate = _rate_estimate(snap, starts)
    if by_rate is not None and needed == 0:
        estimate, basis = by_rate
    elif by_rate is not None and estimate is not None and by_rate[0] > estimate:
        estimate = by_rate[0]
        basis = f"{basis}; the rate is slower: {by_rate[1]}"
    if pause is not None and estimate is not None and pause > estimate:
        estimate = pause
        basis = f"{basis}; nobody starts before the throttle pause ends"
    return estimate, basis


def _hold_estimate(snap: Snapshot) -> tuple[float | None, str]:
    """Seconds a permit is typically held, and how that was found."""
    recent = snap.hold_time_avg
    if recent is not None and recent > 0:
        return recent, "the average hold time of recent releases"
    ages = [snap.server_time - h.acquired_at for h in snap.holders]
    if not ages:
        return None, "no holder to estimate from"
    # A holder seen mid-way has run about half its hold on average (for holds of similar
    # length), so twice the mean age is the guess: nothing has been released yet (or every
    # hold so far was under a millisecond).
    return 2 * sum(ages) / len(ages), (
        "twice the current holders' mean age (no hold-time history is available)"
    )


def _rate_estimate(snap: Snapshot, starts: int) -> tuple[float, str] | None:
    """Roughly when ``starts`` more weight may have started under the rate: in each window
    whose room is short, the first start waits for the window to open, and the rest start at
    its pace (``count`` per period; the log's real spacing may differ).  The slowest window,
    with its reason; None when every window has room for them all (or there is no rate)."""
    slowest: tuple[float, str] | None = None
    for win in getattr(snap, "rates", None) or []:
        short = starts - win.available
        if short <= 0:
            continue
        pace = win.rate.period_seconds / win.rate.count
        # full: the first waits for the window to open; else the room goes first
        wait = win.opens_in + (short - 1) * pace if win.available == 0 else short * pace
        if slowest is None or wait > slowest[0]:
            slowest = (
                wait,
                f"rough; the rate {win.rate} allows {win.rate.count} start(s) per "
                f"{seconds_text(win.rate.period_seconds)} and has room for {win.available} "
                f"now; {starts} start(s) up to and including its own",
            )
    return slowest


def _cap(snap: Snapshot, me: WaiterInfo, info: Mapping[str, Any]) -> dict[str, Any]:
    """The cap that applies: the partition's when the core reports a capped partition or
    several partitions (a share of the limit), else the limit."""
    partition = getattr(me, "partition", None)
    parts = partitions(snap)
    if partition is not None:
        for part in parts:
            if part.get("name") == partition and (part.get("cap") is not None or len(parts) > 1):
                return {"kind": "partition", "partition": partition, "detail": part}
    return {"kind": "limit", "limit": info["limit"], "source": info["source"]}
