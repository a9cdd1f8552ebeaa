"""Why a waiter waits, in one vocabulary for ``show``, ``explain``, ``top``, the web page and
the metrics: each waiter's ``reason``, and the waiters counted by reason.

A reason is a dict: ``kind`` (one of :data:`REASONS`), ``text`` (a table cell: what holds
it, in a few words), ``because`` (the same as the end of a sentence "the task waits
because ...") and ``ends_in`` (seconds until it ends; None when unknown: units and caps come
back when holders release).  The kinds, checked in this order (the first that holds wins):

* :data:`PAUSE`: a throttle pause (``Semaphore.throttled(retry_after=...)``, an
  ``adaptive=True`` semaphore that was throttled) holds every start;
* :data:`CAP`: its partition (its queue, by default) is at its cap (``queue_limits``);
* :data:`UNITS`: the semaphore is full: its units (those of the waiters ahead of it in its
  partition's line, and its own) do not fit in the free units (of the effective limit);
* :data:`RATE`: a rate window has no room for its start (and those ahead of it);
* :data:`STARTING`: nothing holds it: its units are free, it starts when it is woken.

Positions count within a partition's line, first come first served; a waiter behind others
waits for what they need as well as its own, so its reason counts their units too.
:mod:`.views` re-exports the public names.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..core.semaphore import Snapshot, WaiterInfo
from .views_state import partitions, seconds_text
from .views_why import held_by

__all__ = [
    "CAP",
    "PAUSE_REASON",
    "RATE_REASON",
    "REASONS",
    "SLOT",
    "STARTING",
    "UNITS",
    "reason_label",
    "waiter_reasons",
    "waiting_by_reason",
]

#: the semaphore is full (its free units are fewer than the waiter needs)
UNITS = "units"
#: its partition (queue) is at its cap (``queue_limits``)
CAP = "cap"
#: a rate window is full
RATE_REASON = "rate"
#: a throttle pause (adaptive) holds every start
PAUSE_REASON = "pause"
#: nothing holds it: its units are free and it starts when woken
STARTING = "starting"
#: its worker has no free pool slot for it (other work fills them): it keeps its place
SLOT = "slot"
#: every kind, in the order they are checked (the metrics' ``reason`` label takes these)
REASONS = (SLOT, PAUSE_REASON, CAP, UNITS, RATE_REASON, STARTING)

#: a few words per kind, for ``top``'s count by reason and the page's overview
_LABELS = {
    PAUSE_REASON: "adaptive pause",
    CAP: "queue at its cap",
    UNITS: "semaphore full",
    RATE_REASON: "rate window full",
    STARTING: "starting",
    SLOT: "no free slot",
}


def reason_label(kind: str) -> str:
    """``"queue at its cap"``: a reason's kind in a few words."""
    return _LABELS.get(kind, kind)


def _ahead_text(count: int, units: int) -> str:
    if not count:
        return ""
    return f"; the {count} waiter(s) ahead of it in its line need {units} more"


def _reason(
    snap: Snapshot, w: WaiterInfo, ahead: tuple[int, int], limit: int | None
) -> dict[str, Any]:
    """``w``'s reason; ``ahead``: (waiters, units) ahead of it in its partition's line."""
    count, units = ahead
    need = units + w.weight
    more = _ahead_text(count, units)
    pause = getattr(snap, "paused_for", None)
    if not getattr(w, "ready", True):
        node = w.owner.get("held_by") or "its worker"
        because = (
            f"its worker ({node}) has no free pool slot for it: other work fills its slots; it "
            "keeps its place in line, and its turn comes once a slot frees"
        )
        return _made(SLOT, f"no free slot on {node}: it keeps its place{more}", because, None)
    why = held_by(snap, w, limit)  # a head whose units fit: its own words for rate and pause
    if pause is not None and pause > 0:
        ends = round(pause, 3)
        because = (
            "an adaptive pause holds every start: the service it calls pushed back "
            f"(throttled), and nobody starts for {seconds_text(ends)}"
        )
        text = why["text"] if why else f"adaptive pause: nobody starts for {seconds_text(ends)}"
        return _made(PAUSE_REASON, text, because, ends)
    part = _partition(snap, w)
    cap = part.get("cap")
    used_p = int(part.get("used") or 0)
    if isinstance(cap, int) and used_p + need > cap:
        name = part.get("name") or "(default)"
        text = f"queue {name} at its cap: {used_p} of {cap} unit(s) in use{more}"
        because = (
            f"its queue {name!r} is at its cap (queue_limits): it holds {used_p} of its {cap} "
            f"unit(s), and it needs {w.weight}{more}"
        )
        return _made(CAP, text, because, None)
    effective = snap.limit if limit is None else limit
    free = max(0, effective - snap.used)
    alone = count == 0 and snap.used == 0 and effective < snap.limit  # may start alone
    if need > free and not alone:
        return _units(snap, w.weight, effective, more)
    full = [win for win in getattr(snap, "rates", None) or [] if win.available < need]
    if full:
        ends = round(max(win.opens_in for win in full), 3)
        names = ", ".join(str(win.rate) for win in full)
        left = min(win.available for win in full)
        text = why["text"] if why else f"rate {names} full: opens in {seconds_text(ends)}"
        because = (
            f"its rate window is full: the rate {names} has room for {left} more start(s) "
            f"now and it needs {need} (its own{' and those ahead of it' if count else ''}); "
            f"the window opens in {seconds_text(ends)}"
        )
        return _made(RATE_REASON, text, because, ends)
    text = "nothing holds it: its units are free, it starts when woken"
    because = (
        "nothing holds it any more: its units are free, and it starts as soon as it is woken "
        "(or its parked copy arrives)"
    )
    return _made(STARTING, text, because, 0.0)


def _units(snap: Snapshot, weight: int, effective: int, more: str) -> dict[str, Any]:
    """The reason "units": the free units of the ``effective`` limit are too few."""
    free = max(0, effective - snap.used)
    lowered = effective < snap.limit
    of = f"{effective} (lowered; {snap.limit})" if lowered else f"{effective}"
    text = f"semaphore full: {snap.used} of {of} unit(s) in use, {free} free{more}"
    of_long = (
        f"its lowered (adaptive) limit {effective} of {snap.limit}"
        if lowered
        else f"its limit {effective}"
    )
    because = (
        f"the semaphore is full: {snap.used} unit(s) of {of_long} are in use and {free} "
        f"free, and it needs {weight}{more}"
    )
    return _made(UNITS, text, because, None)


def _made(kind: str, text: str, because: str, ends_in: float | None) -> dict[str, Any]:
    return {"kind": kind, "label": reason_label(kind), "text": text, "because": because,
            "ends_in": ends_in}  # fmt: skip


def _partition(snap: Snapshot, w: WaiterInfo) -> dict[str, Any]:
    mine = getattr(w, "partition", "") or ""
    for part in partitions(snap):
        if (part.get("name") or "") == mine:
            return part
    return {"name": mine}


def waiter_reasons(snap: Snapshot, limit: int | None = None) -> dict[str, dict[str, Any]]:
    """Every waiter's reason, by ticket; ``limit``: the effective limit (default: the
    snapshot's limit in force)."""
    lines: dict[str, list[WaiterInfo]] = defaultdict(list)
    for w in snap.waiters:
        lines[getattr(w, "partition", "") or ""].append(w)
    out: dict[str, dict[str, Any]] = {}
    for line in lines.values():
        count = units = 0
        for w in sorted(line, key=lambda x: x.position):
            out[w.ticket] = _reason(snap, w, (count, units), limit)
            count, units = count + 1, units + w.weight
    return out


def waiting_by_reason(reasons: dict[str, dict[str, Any]]) -> dict[str, int]:
    """How many waiters wait for each reason (every kind, 0 included)."""
    counts = dict.fromkeys(REASONS, 0)
    for reason in reasons.values():
        counts[reason["kind"]] = counts.get(reason["kind"], 0) + 1
    return counts
