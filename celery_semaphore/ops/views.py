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

Limits that follow the downstream service (``Semaphore(adaptive=True)``) are shown as
``effective`` (:func:`effective_info`): the units that may be held now (an adaptive limit
below the limit in force), the pause, the throttles so far, and in words why the effective
limit is lower.  Free units (``available``, and the checks above) count from the effective
limit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from ..core.semaphore import HolderInfo, RateWindowInfo, Semaphore, Snapshot, WaiterInfo
from .registry import Known

__all__ = [
    "detail",
    "effective_info",
    "explain",
    "find_task",
    "held_by",
    "held_by_pause",
    "held_by_rate",
    "limit_info",
    "rate_info",
    "rate_windows",
    "seconds_text",
    "semaphore_for_known",
    "summary",
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


def limit_info(entry: Known, snap: Snapshot) -> dict[str, Any]:
    """The limit in force and where it comes from: runtime override, setting or code."""
    code = entry.code_limits
    if snap.limit_override is not None:
        limit: int | None = snap.limit_override
        source = "override"
    else:
        limit, source = entry.configured_limit, entry.configured_source
    return {
        "limit": limit,
        "source": source,
        "override": snap.limit_override,
        "setting": entry.setting,
        "code": code[0] if len(code) == 1 else (code or None),
    }


def _plain(value: Any) -> Any:
    """Dataclasses and mappings (partition records) as plain dicts."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _partitions(snap: Snapshot) -> list[dict[str, Any]]:
    """The core's partition records (name, used, waiters, cap, weight) as dicts, with
    ``waiters`` renamed ``waiting`` like the semaphore's own count."""
    parts = getattr(snap, "partitions", None) or []
    if isinstance(parts, Mapping):
        records = [{"name": k, **_plain(v)} for k, v in parts.items()]
    else:
        records = [dict(_plain(p)) for p in parts]
    for record in records:
        if "waiters" in record and "waiting" not in record:
            record["waiting"] = record.pop("waiters")
    return records


def _window(win: RateWindowInfo) -> dict[str, Any]:
    return {
        "rate": str(win.rate),
        "count": win.rate.count,
        "period": win.rate.period_seconds,
        "started": win.started,
        "available": win.available,
        "opens_in": round(win.opens_in, 3),
    }


def rate_windows(snap: Snapshot) -> list[dict[str, Any]]:
    """The rate windows in force (``Snapshot.rates``), by period: ``rate`` (``"10/s"``),
    ``count``, ``period`` (seconds), ``started`` (weight started in the window), ``available``
    (weight that may still start) and ``opens_in`` (seconds until it has room for one more
    start; 0.0: it has room now).  Empty without a rate."""
    return [_window(win) for win in getattr(snap, "rates", None) or []]


def rate_info(snap: Snapshot) -> dict[str, Any]:
    """The rate in force and where it comes from: ``rate`` (``"10/s, 100/m"``; None: no
    rate), ``source`` (``"override"``: the runtime rate override, ``set-limit --rate``;
    ``"acquirers"``: the ``rate=`` the last acquirer sent; None: no rate) and ``override``
    (the override's windows as text, None when there is none)."""
    windows = [str(win.rate) for win in getattr(snap, "rates", None) or []]
    override = getattr(snap, "rate_override", None)
    source = None if not windows else ("override" if override is not None else "acquirers")
    return {
        "rate": ", ".join(windows) or None,
        "source": source,
        "override": None if override is None else [str(r) for r in override],
    }


def effective_info(snap: Snapshot, limit: int | None) -> dict[str, Any]:
    """The limit that holds now when the downstream service pushed back
    (``Semaphore.throttled``): ``limit`` (the units that may be held now: the adaptive limit
    when it is below ``of``, the limit in force), ``lowered`` (True while it is),
    ``paused_for`` (seconds until the throttle pause ends; None: no pause),
    ``throttles_total``, ``last_throttle_age`` (seconds; None: never throttled), ``rises_per``
    (while lowered: the units of finished work released after which it rises by one) and
    ``text``: why it is lower or paused, in words (None when it is neither)."""
    adaptive = getattr(snap, "adaptive_limit", None)
    lowered = limit is not None and adaptive is not None and adaptive < limit
    effective = adaptive if lowered else limit
    pause = getattr(snap, "paused_for", None)
    paused = None if pause is None else round(pause, 3)
    throttles = int(getattr(snap, "throttles_total", 0) or 0)
    age = getattr(snap, "last_throttle_age", None)
    last = None if age is None else round(age, 3)
    after = f"after {throttles} throttle(s)" + (
        f", the last {seconds_text(last)} ago" if last is not None else ""
    )
    text = None
    if lowered:
        text = (
            f"effective limit {effective} of {limit}: lowered {after}, rising by 1 per "
            f"{effective} unit(s) of finished work"
        )
        if paused is not None:
            text += f"; paused {seconds_text(paused)} more"
    elif paused is not None:
        text = f"paused {seconds_text(paused)} more {after}: nobody starts until then"
    return {
        "limit": effective,
        "of": limit,
        "lowered": lowered,
        "paused_for": paused,
        "throttles_total": throttles,
        "last_throttle_age": last,
        "rises_per": effective if lowered else None,
        "text": text,
    }


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
        "oldest_wait": round(oldest, 3),
        "hold_time_avg": None if snap.hold_time_avg is None else round(snap.hold_time_avg, 3),
        "reclaimed_total": snap.reclaimed_total,
        "grants_total": snap.grants_total,
        "tasks": sorted(entry.tasks),
        "partitions": _partitions(snap),
        "rates": rate_windows(snap),
        "rate": rate_info(snap),
        "found_in": sorted(entry.found_in),
        "recorded_by": entry.node,
        "recorded_at": entry.recorded_at,
    }


def _holder(h: HolderInfo, now: float) -> dict[str, Any]:
    owner = h.owner
    return {
        "token": h.token,
        "task_id": owner.get("task_id"),
        "task": owner.get("task"),
        "host": owner.get("host") or owner.get("machine"),
        "pid": owner.get("pid"),
        "weight": h.weight,
        "age": round(now - h.acquired_at, 3),
        "lease_left": round(h.lease_remaining, 3),
        "fencing_token": h.fencing_token,
        "partition": getattr(h, "partition", None),
    }


#: How a waiter waits, in the words the CLI, the logs and the docs all use.
HELD = "held by a worker"
SLOT = "waiting in a slot"
STANDBY = "standing by in a slot"
PARKED = "parked in the broker"
BLOCKED = "blocked (direct acquire)"


def how_waiting(owner: Mapping[str, Any], parked: bool) -> str:
    """A waiter's state: held by a worker's gate (off the pool), sent ahead by it to stand by
    in a worker slot, waiting in a worker slot, parked in the broker (re-published with a
    countdown), or a direct ``acquire`` outside Celery."""
    if owner.get("held_by"):
        return HELD
    if parked and owner.get("standby"):
        return STANDBY
    if parked:
        return PARKED
    return SLOT if owner.get("task_id") else BLOCKED


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
    for part in _partitions(snap):
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
        "windows": [_window(win) for win in full],
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


def seconds_text(seconds: float) -> str:
    """``0.4s``, ``12.3s``, ``5m03s``, ``2h05m``: a duration as every view writes it."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def _waiter(
    w: WaiterInfo, now: float, snap: Snapshot | None = None, limit: int | None = None
) -> dict[str, Any]:
    owner = w.owner
    return {
        "position": w.position,
        "ticket": w.ticket,
        "task_id": owner.get("task_id"),
        "task": owner.get("task"),
        "host": owner.get("host") or owner.get("machine"),
        "weight": w.weight,
        "waited": round(now - w.waiting_since, 3),
        "parked": w.parked,
        "how": how_waiting(owner, w.parked),
        "held_by": owner.get("held_by"),
        "place_left": round(w.place_remaining, 3),
        "partition": getattr(w, "partition", None),
        "why": None if snap is None else held_by(snap, w, limit),
    }


def detail(entry: Known, snap: Snapshot) -> dict[str, Any]:
    """``show NAME``: the summary plus every holder and waiter."""
    now = snap.server_time
    row = summary(entry, snap)
    limit = row["effective"]["limit"] or 0
    return {
        **row,
        "server_time": now,
        "holder_list": [_holder(h, now) for h in snap.holders],
        "waiter_list": [_waiter(w, now, snap, limit) for w in snap.waiters],
    }


def find_task(snap: Snapshot, task_id: str) -> tuple[list[HolderInfo], list[WaiterInfo]]:
    """The holders and waiters of ``snap`` whose owner is task ``task_id``."""
    return (
        [h for h in snap.holders if h.owner.get("task_id") == task_id],
        [w for w in snap.waiters if w.owner.get("task_id") == task_id],
    )


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


def explain(entry: Known, snap: Snapshot, task_id: str) -> dict[str, Any] | None:
    """Why task ``task_id`` is (not) running on this semaphore; None if it is not there."""
    held, waiting = find_task(snap, task_id)
    if not held and not waiting:
        return None
    now = snap.server_time
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
        out.update(state="holding", holding=[_holder(h, now) for h in held])
        return out
    me = waiting[0]
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
    if needed == 0:
        estimate: float | None = 0.0
        basis = "its units are free now: it runs as soon as it is woken or its copy arrives"
    elif hold is None or limit <= 0:
        estimate = None
    else:
        estimate = needed * hold / limit  # `limit` units turn over every `hold` seconds
    waiter = _waiter(me, now, snap, limit)
    why = waiter["why"]
    head = next((w for w in ahead if w.position == 0), None)
    head_why = None if head is None else held_by(snap, head, limit)
    if why is not None and why["kind"] == PAUSE:
        estimate = why["ends_in"]
        basis = "its units are free: it starts when the throttle pause ends"
        if why["rate"] is not None:
            basis += f" and the rate {why['rate']['rate']} has room"
    elif why is not None:
        estimate = why["ends_in"]
        basis = f"its units are free: it starts when the rate {why['rate']} has room"
        if why["at_least"]:
            basis += f" for its weight {me.weight}"
            by_rate = _rate_estimate(snap, me.weight)
            if by_rate is not None and by_rate[0] > estimate:
                estimate = min(by_rate[0], why["ends_within"])
                basis += ", roughly at the window's pace"
    else:
        # the units are not all: the starts up to its own need room in every rate window
        by_rate = _rate_estimate(snap, ahead_units + me.weight)
        if by_rate is not None and needed == 0:
            estimate, basis = by_rate
        elif by_rate is not None and estimate is not None and by_rate[0] > estimate:
            estimate = by_rate[0]
            basis = f"{basis}; the rate is slower: {by_rate[1]}"
        pause = effective["paused_for"]
        if pause is not None and estimate is not None and pause > estimate:
            estimate = pause
            basis = f"{basis}; nobody starts before the throttle pause ends"
    out.update(
        state="waiting",
        waiter=waiter,
        why=why,
        head_why=head_why,
        rates=rate_windows(snap),
        ahead=[_waiter(w, now, snap, limit) for w in ahead],
        ahead_units=ahead_units,
        free=free,
        needed=needed,
        cap=_cap(snap, me, info),
        holders=[_holder(h, now) for h in snap.holders],
        estimate=None if estimate is None else round(estimate, 1),
        estimate_basis=basis,
        hold_estimate=None if hold is None else round(hold, 3),
    )
    return out


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
    parts = _partitions(snap)
    if partition is not None:
        for part in parts:
            if part.get("name") == partition and (part.get("cap") is not None or len(parts) > 1):
                return {"kind": "partition", "partition": partition, "detail": part}
    return {"kind": "limit", "limit": info["limit"], "source": info["source"]}
