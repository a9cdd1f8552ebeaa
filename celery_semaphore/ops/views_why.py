"""Why a waiter waits when it is not the units nor its turn in line: a full rate window
(:func:`held_by_rate`) or a throttle pause (:func:`held_by_pause`); and a waiter as a dict,
with that reason (:func:`waiter`).  :mod:`.views` re-exports the public names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.semaphore import Snapshot, WaiterInfo
from .views_state import how_waiting, partitions, seconds_text, window_info

__all__ = ["PAUSE", "RATE", "held_by", "held_by_pause", "held_by_rate", "waiter_info"]


#: Why a waiter waits, when it is not the units (or its turn in line): a rate window is full.
RATE = "rate"
#: ... or a throttle pause (``Semaphore.throttled(retry_after=...)``) holds every new grant.
PAUSE = "pause"


def _free_units(snap: Snapshot, limit: int | None) -> int:
    return max(0, (limit if limit is not None else snap.limit) - snap.used)


def _head_fits(snap: Snapshot, w: WaiterInfo, limit: int | None) -> bool:
    """Whether ``w`` is the head of its partition's line and its weight fits the free units
    (``limit`` minus the units in use; ``limit`` defaults to the snapshot's) and its
    partition's cap: nothing but a rate window or a pause can hold it.  Under a lowered
    (adaptive) limit a heavier head fits too when nothing is held: it may start alone."""
    if w.position != 0:
        return False
    free = _free_units(snap, limit)
    alone = snap.used == 0 and limit is not None and limit < snap.limit
    if w.weight > free and not alone:
        return False
    mine = getattr(w, "partition", None)
    for part in partitions(snap):
        cap = part.get("cap")
        fits = not isinstance(cap, int) or int(part.get("used") or 0) + w.weight <= cap
        if part.get("name") == mine and not fits:
            return False
    return True


def held_by_rate(snap: Snapshot, w: WaiterInfo, limit: int | None = None) -> dict[str, Any] | None:
    """Whether ``w`` is held by the rate rather than by the units: it is the head of its
    partition's line, its weight fits the free units (``limit`` minus the units in use;
    ``limit``, the effective limit, defaults to the snapshot's) and its partition's cap, but
    not the room left in some rate window.  None when it is not (or there is no rate); else
    ``kind`` "rate", ``windows`` (the full ones, as :func:`rate_windows` gives them), ``rate``
    (their rates, ``"2/s, 100/m"``), ``ends_in`` (seconds until the last of them has room for
    one more start: for a weight above 1 the room for its whole weight may come later,
    ``at_least`` says so), ``ends_within`` (the longest of their periods: by then every window
    has room for any weight it admits) and ``text``."""
    rates = getattr(snap, "rates", None) or []
    if not rates or not _head_fits(snap, w, limit):
        return None
    full = [win for win in rates if win.available < w.weight]
    if not full:
        return None
    ends_in = round(max(win.opens_in for win in full), 3)
    # every start in a window leaves it within its period: by then it has room for `count`
    ends_within = max(win.rate.period_seconds for win in full)
    at_least = w.weight > 1
    names = ", ".join(str(win.rate) for win in full)
    if at_least:
        left = min(win.available for win in full)
        text = (
            f"held by the rate {names}: its weight {w.weight} needs more room than the {left} "
            f"left; enough opens within {seconds_text(ends_within)}"
        )
    else:
        window = "window opens" if len(full) == 1 else "windows open"
        text = f"held by the rate {names}: the {window} in {seconds_text(ends_in)}"
    return {
        "kind": RATE,
        "rate": names,
        "windows": [window_info(win) for win in full],
        "ends_in": ends_in,
        "ends_within": ends_within,
        "at_least": at_least,
        "text": text,
    }


def held_by_pause(snap: Snapshot, w: WaiterInfo, limit: int | None = None) -> dict[str, Any] | None:
    """Whether ``w`` is held by a throttle pause: it is the head of its line and its weight
    fits (as for :func:`held_by_rate`), but nobody starts until the pause ends.  None when it
    is not (or there is no pause); else ``kind`` "pause", ``ends_in`` (seconds until the
    pause ends, or until the rate has room too when that is later), ``pause_ends_in``,
    ``rate`` (the rate's reason, :func:`held_by_rate`, when it holds the head as well; None
    otherwise) and ``text``."""
    pause = getattr(snap, "paused_for", None)
    if pause is None or pause <= 0 or not _head_fits(snap, w, limit):
        return None
    pause_ends = round(pause, 3)
    by_rate = held_by_rate(snap, w, limit)
    text = f"held by a throttle pause: it ends in {seconds_text(pause_ends)}"
    ends_in = pause_ends
    if by_rate is not None:
        text += f"; and {by_rate['text']}"
        ends_in = max(ends_in, by_rate["ends_in"])
    return {
        "kind": PAUSE,
        "ends_in": ends_in,
        "pause_ends_in": pause_ends,
        "rate": by_rate,
        "text": text,
    }


def held_by(snap: Snapshot, w: WaiterInfo, limit: int | None = None) -> dict[str, Any] | None:
    """Why ``w`` waits when it is not the units nor its turn: a throttle pause
    (:func:`held_by_pause`, which names the rate too when both hold it), else the rate
    (:func:`held_by_rate`); None when neither holds it."""
    return held_by_pause(snap, w, limit) or held_by_rate(snap, w, limit)


def waiter_info(
    w: WaiterInfo,
    now: float,
    snap: Snapshot | None = None,
    limit: int | None = None,
    reasons: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A waiter as a dict; ``why`` (a rate or a pause holding a head whose units fit) and
    ``reason`` (why it waits, whatever it is: :func:`.views_reason.waiter_reasons`, which
    ``reasons`` gives by ticket; None without)."""
    owner = w.owner
    return {
        "position": w.position,
        "ticket": w.ticket,
        "task_id": owner.get("task_id"),
        "task": owner.get("task"),
        "host": owner.get("host") or owner.get("machine"),
        "weight": w.weight,
        "priority": getattr(w, "priority", 0),
        "waited": round(now - w.waiting_since, 3),
        "parked": w.parked,
        "how": how_waiting(owner, w.parked),
        "held_by": owner.get("held_by"),
        "place_left": round(w.place_remaining, 3),
        "partition": getattr(w, "partition", None),
        "why": None if snap is None else held_by(snap, w, limit),
        "reason": None if reasons is None else reasons.get(w.ticket),
    }
