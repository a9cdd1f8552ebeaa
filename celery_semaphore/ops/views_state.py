"""A snapshot's pieces as plain, JSON-ready dicts: the limit and where it comes from, the rate,
the effective (adaptive) limit, the partitions, a holder, how a waiter waits.  The bottom of
:mod:`.views` (which re-exports the public names); see there for what each field means."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..core.semaphore import HolderInfo, RateWindowInfo, Snapshot, WaiterInfo
from .registry import Known

__all__ = [
    "BLOCKED",
    "HELD",
    "PARKED",
    "SLOT",
    "STANDBY",
    "effective_info",
    "find_task",
    "holder_info",
    "how_waiting",
    "limit_info",
    "liveness_state",
    "partitions",
    "rate_info",
    "rate_windows",
    "seconds_text",
    "window_info",
]


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


def partitions(snap: Snapshot) -> list[dict[str, Any]]:
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


def window_info(win: RateWindowInfo) -> dict[str, Any]:
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
    return [window_info(win) for win in getattr(snap, "rates", None) or []]


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


def seconds_text(seconds: float) -> str:
    """``0.4s``, ``12.3s``, ``5m03s``, ``2h05m``: a duration as every view writes it."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def holder_info(h: HolderInfo, now: float) -> dict[str, Any]:
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
        "process": h.process,
        "liveness": liveness_state(h),
        "liveness_left": None if h.liveness_remaining is None else round(h.liveness_remaining, 3),
    }


def liveness_state(h: HolderInfo) -> str | None:
    """A holder's process liveness: ``"alive"`` (its record is live), ``"expired"`` (the
    record expired ``-liveness_left`` seconds ago), ``"gone"`` (no record: the process is
    dead), None (granted without a liveness ident, or the records cannot be read: only the
    lease brings it back).  Expired and gone are reclaimed at the next call for the name."""
    if h.process_alive is None:
        return None
    if h.process_alive:
        return "alive"
    return "gone" if h.liveness_remaining is None else "expired"


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


def find_task(snap: Snapshot, task_id: str) -> tuple[list[HolderInfo], list[WaiterInfo]]:
    """The holders and waiters of ``snap`` whose owner is task ``task_id``."""
    return (
        [h for h in snap.holders if h.owner.get("task_id") == task_id],
        [w for w in snap.waiters if w.owner.get("task_id") == task_id],
    )
