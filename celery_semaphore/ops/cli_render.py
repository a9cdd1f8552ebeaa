"""Text rendering of :mod:`celery_semaphore.ops.views` dicts for ``celery semaphore``."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from . import views

__all__ = [
    "audit_lines",
    "detail",
    "duration",
    "effective_line",
    "explanation",
    "limit_lines",
    "listing",
    "rate_line",
    "top_frame",
]

BAR_WIDTH = 30


def duration(seconds: float | None) -> str:
    """``0.4s``, ``12.3s``, ``5m03s``, ``2h05m``; ``-`` for None."""
    return "-" if seconds is None else views.seconds_text(seconds)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], indent: str = "") -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [
        indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [list(headers), *cells]
    ]
    return "\n".join(lines)


def _tasks(names: Sequence[str], most: int) -> str:
    """The first ``most`` task names, then how many more (``--json`` lists them all)."""
    if not names:
        return "-"
    shown = ", ".join(names[:most])
    return shown + (f" (+{len(names) - most} more)" if len(names) > most else "")


def _limit(row: Mapping[str, Any]) -> str:
    """``3 (override; setting 4, code 2)``: the limit, its source, and the others known."""
    others = []
    if row["source"] != "setting" and row.get("setting") is not None:
        others.append(f"setting {row['setting']}")
    code = row.get("code")
    if row["source"] != "code" and code is not None:
        others.append(f"code {code}")
    elif isinstance(code, list):
        others.append(f"code differs by task: {', '.join(map(str, code))}")
    extra = f"; {', '.join(others)}" if others else ""
    return f"{_cell(row['limit'])} ({row['source']}{extra})"


def _partition_name(part: Mapping[str, Any]) -> str:
    name = str(part.get("name", "?"))
    return name or "(default)"  # the core calls the default partition ""


def _partition_line(part: Mapping[str, Any]) -> str:
    name = _partition_name(part)
    rest = ", ".join(
        f"{k} {_cell(v)}"
        for k, v in part.items()
        if k != "name" and not isinstance(v, (list, dict))
    )
    return f"partition {name}: {rest}" if rest else f"partition {name}"


def rate_line(win: Mapping[str, Any]) -> str:
    """``rate 10/s: 7 started, 3 available``; when full, ``..., opens in 0.4s``."""
    text = f"rate {win['rate']}: {win['started']} started, {win['available']} available"
    if win["available"] <= 0 or win["opens_in"] > 0:
        text += f", opens in {duration(win['opens_in'])}"
    return text


def effective_line(data: Mapping[str, Any]) -> str | None:
    """``effective limit 5 of 10: lowered after 3 throttle(s), the last 4.2s ago, rising by 1
    per 5 unit(s) of finished work; paused 1.2s more``, or ``paused 1.2s more after ...``;
    None while the limit is not lowered and nothing is paused."""
    effective = data.get("effective") or {}
    text = effective.get("text")
    return None if not text else str(text)


def limit_lines(data: Mapping[str, Any]) -> list[str]:
    """What limits the starts besides the units: the effective limit when the downstream
    service lowered it or paused the grants (:func:`effective_line`), then one line per rate
    window (none without a rate)."""
    line = effective_line(data)
    rate = data.get("rate") or {}
    windows = []
    for win in data.get("rates") or []:
        text = rate_line(win)
        if rate.get("source") == "override":
            text = text.replace(": ", " (runtime override): ", 1)
        windows.append(text)
    return ([line] if line else []) + windows


def listing(rows: Sequence[Mapping[str, Any]], prefix: str) -> str:
    if not rows:
        return (
            f"no semaphores known under key prefix {prefix!r} (no limited task in the app, "
            "none registered by a worker, no state in Redis)"
        )
    body = []
    for row in rows:
        body.append(
            [
                row["name"],
                _cell(row["limit"]),
                row["source"],
                f"{row['used']}/{_cell(row['limit'])}",
                row["holders"],
                row["waiting"],
                duration(row["oldest_wait"]) if row["waiting"] else "-",
                _tasks(row["tasks"], 2),
            ]
        )
    out = [
        table(["NAME", "LIMIT", "FROM", "IN USE", "HOLDERS", "WAITING", "OLDEST", "TASKS"], body)
    ]
    for row in rows:
        for part in row["partitions"]:
            out.append(f"  {row['name']} / {_partition_line(part)}")
        for line in limit_lines(row):
            out.append(f"  {row['name']} / {line}")
    return "\n".join(out)


def _average(seconds: float | None) -> str:
    """The average hold of recent releases, or why there is none."""
    if seconds is None:
        return "- (nothing released yet)"
    return f"{duration(seconds)} (recent releases)"


def detail(data: Mapping[str, Any]) -> str:
    effective = data.get("effective") or {}
    of = _cell(data["limit"])
    if effective.get("lowered"):
        of = f"{effective['limit']} (the effective limit; the limit is {of})"
    throttles = int(effective.get("throttles_total") or 0)
    lines = [
        f"semaphore {data['name']!r}: limit {_limit(data)}",
        f"in use: {data['used']} of {of} unit(s) by {data['holders']} "
        f"holder(s); {data['waiting']} waiting"
        + (f" (oldest {duration(data['oldest_wait'])})" if data["waiting"] else ""),
        f"tasks: {_tasks(data['tasks'], 5)}",
        f"held on average: {_average(data.get('hold_time_avg'))}; "
        f"{data.get('reclaimed_total', 0)} lease(s) expired and taken back; "
        f"{data.get('grants_total', 0)} permit(s) granted so far"
        + (
            f"; throttled {throttles} time(s), the last "
            f"{duration(effective.get('last_throttle_age'))} ago"
            if throttles
            else ""
        ),
    ]
    for part in data["partitions"]:
        lines.append(f"  {_partition_line(part)}")
    for line in limit_lines(data):
        lines.append(f"  {line}")
    lines.append("")
    holders = data["holder_list"]
    lines.append(f"HOLDERS ({len(holders)})")
    if holders:
        lines.append(
            table(
                ["TOKEN", "TASK ID", "TASK", "HOST", "PID", "WEIGHT", "AGE", "LEASE LEFT", "FENCE"],
                [
                    [
                        h["token"],
                        h["task_id"],
                        h["task"],
                        h["host"],
                        h["pid"],
                        h["weight"],
                        duration(h["age"]),
                        duration(h["lease_left"]),
                        h["fencing_token"],
                    ]
                    for h in holders
                ],
                indent="  ",
            )
        )
    waiters = data["waiter_list"]
    lines.append(f"WAITERS ({len(waiters)})")
    if waiters:
        # WHY only when a waiter waits for something other than units or its turn
        why = any(w.get("why") for w in waiters)
        lines.append(
            table(
                ["POS", "TASK ID", "TASK", "PARTITION", "WEIGHT", "WAITED", "HOW"]
                + (["WHY"] if why else []),
                [
                    [
                        w["position"],
                        w["task_id"] or w["ticket"],
                        w["task"],
                        w["partition"] or None,
                        w["weight"],
                        duration(w["waited"]),
                        _how(w),
                    ]
                    + ([_why(w)] if why else [])
                    for w in waiters
                ],
                indent="  ",
            )
        )
    actions = data.get("operator_actions") or []
    if actions:
        lines.append("RECENT OPERATOR ACTIONS")
        lines.append(audit_lines(actions, indent="  "))
    return "\n".join(lines)


#: ``explain``'s sentence for each way of waiting (see :func:`views.how_waiting`)
_HOW_LONG = {
    views.HELD: "held by a worker ({node}), off the pool, unacknowledged; the release that "
    "frees its units hands them to it",
    views.SLOT: "waiting in a slot of its worker's pool, woken by the release",
    views.STANDBY: "sent ahead by its worker's gate to stand by in a pool slot; the release "
    "that frees its units grants them to it there",
    views.PARKED: "parked in the broker (re-published with a countdown); the release that "
    "frees its units wakes it",
    views.BLOCKED: "blocked in a direct acquire (outside a Celery worker), woken by the release",
}


def _how(w: Mapping[str, Any]) -> str:
    if w["how"] == views.HELD and w.get("held_by"):
        return f"held by {w['held_by']}"
    return str(w["how"])


def _why(w: Mapping[str, Any]) -> str | None:
    """``held by the rate 2/s: the window opens in 0.4s`` (None: units or its turn)."""
    why = w.get("why")
    return None if not why else str(why["text"])


def explanation(r: Mapping[str, Any]) -> str:
    if r["state"] == "holding":
        h = r["holding"][0]
        return (
            f"task {r['task_id']} ({h['task'] or '?'}) holds semaphore {r['name']!r}: token "
            f"{h['token']}, {h['weight']} unit(s), for {duration(h['age'])} on {h['host']} "
            f"(pid {h['pid']}), lease left {duration(h['lease_left'])}.\nIt is not waiting for "
            "this semaphore."
        )
    w = r["waiter"]
    cap = r["cap"]
    if cap["kind"] == "partition":
        cap_text = _partition_line(cap["detail"])
    elif (r.get("effective") or {}).get("lowered"):
        cap_text = (
            f"the semaphore's effective limit, {r['effective']['limit']} (lowered by throttles; "
            f"the limit is {_limit(r)})"
        )
    else:
        cap_text = f"the semaphore's limit, {_limit(r)}"
    how = _HOW_LONG.get(w["how"], w["how"]).format(node=w.get("held_by") or "?")
    lines = [
        f"task {r['task_id']} ({w['task'] or '?'}) is waiting for semaphore {r['name']!r}",
        f"  place in line: {w['position']} (0 is the head); {len(r['ahead'])} waiter(s) "
        f"ahead need {r['ahead_units']} unit(s); it needs {w['weight']}",
        f"  cap: {cap_text}",
        f"  in use: {r['used']} unit(s), free now: {r['free']}; units to come free before "
        f"its turn: {r['needed']}",
        f"  waiting for {duration(w['waited'])}, {how}",
    ]
    for line in limit_lines(r):
        lines.append(f"  {line}")
    why = r.get("why")
    if why and why["kind"] == views.PAUSE:
        lines.append(f"  {why['text']} (its units are free: it starts then)")
    elif why:
        if why["at_least"]:
            room = "window has" if len(why["windows"]) == 1 else "windows have"
            then = f"it starts when the {room} room for its weight {w['weight']}"
        else:
            then = "it starts then"
        lines.append(f"  {why['text']} (its units are free: {then})")
    head_why = r.get("head_why")
    if head_why:
        lines.append(f"  the head of its line is {head_why['text']}")
    if r["ahead"]:
        lines.append("  ahead of it:")
        lines.append(
            table(
                ["POS", "TASK ID", "TASK", "WEIGHT", "WAITED", "HOW"],
                [
                    [
                        a["position"],
                        a["task_id"] or a["ticket"],
                        a["task"],
                        a["weight"],
                        duration(a["waited"]),
                        _how(a),
                    ]
                    for a in r["ahead"]
                ],
                indent="    ",
            )
        )
    if r["holders"]:
        lines.append("  holding now:")
        lines.append(
            table(
                ["TASK ID", "TASK", "HOST", "WEIGHT", "AGE", "LEASE LEFT"],
                [
                    [
                        h["task_id"],
                        h["task"],
                        h["host"],
                        h["weight"],
                        duration(h["age"]),
                        duration(h["lease_left"]),
                    ]
                    for h in r["holders"]
                ],
                indent="    ",
            )
        )
    if r["estimate"] is None:
        lines.append(f"  estimate: unknown ({r['estimate_basis']})")
    elif r["needed"]:
        lines.append(
            f"  estimate: about {duration(r['estimate'])} (rough; a hold taken as "
            f"{duration(r['hold_estimate'])}: {r['estimate_basis']})"
        )
    elif r["estimate"] > 0:  # units are free; the rate is what it waits for
        lines.append(f"  estimate: about {duration(r['estimate'])} ({r['estimate_basis']})")
    else:
        lines.append(f"  estimate: now ({r['estimate_basis']})")
    return "\n".join(lines)


def _bar(used: int, limit: int | None, width: int = BAR_WIDTH) -> str:
    if not limit:
        return "[" + "?" * width + "]"
    filled = min(width, round(width * used / limit))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def top_frame(rows: Sequence[Mapping[str, Any]], prefix: str, interval: float) -> str:
    stamp = time.strftime("%H:%M:%S")
    lines = [
        f"celery semaphore top  prefix {prefix!r}  {stamp}  (every {interval:g}s, Ctrl-C quits)"
    ]
    if not rows:
        lines.append("no semaphores known")
    width = max((len(r["name"]) for r in rows), default=4)
    for r in rows:
        waiting = f"{r['waiting']} waiting" + (
            f" (oldest {duration(r['oldest_wait'])})" if r["waiting"] else ""
        )
        lines.append(
            f"{r['name'].ljust(width)}  {_bar(r['used'], r['limit'])}  "
            f"{r['used']}/{_cell(r['limit'])} in use  {waiting}  limit from {r['source']}"
        )
        for part in r["partitions"]:
            used = part.get("used", 0)
            cap = part.get("cap", part.get("limit"))
            name = "  " + _partition_name(part)
            bar = _bar(int(used or 0), cap if isinstance(cap, int) else None)
            lines.append(
                f"{name:<{width}}  {bar}  {used}/{_cell(cap)}  {part.get('waiting', 0)} waiting"
            )
        effective = r.get("effective") or {}
        text = effective_line(r)
        if text:
            name = "  effective"
            eff = effective.get("limit")
            bar = _bar(r["used"], eff if isinstance(eff, int) else None)
            lines.append(f"{name:<{width}}  {bar}  {text}")
        for win in r.get("rates") or []:
            name = f"  rate {win['rate']}"
            bar = _bar(int(win["started"]), int(win["count"]))
            lines.append(f"{name:<{width}}  {bar}  {rate_line(win).split(': ', 1)[1]}")
    return "\n".join(lines)


def audit_lines(entries: Sequence[Mapping[str, Any]], indent: str = "") -> str:
    lines = []
    for e in entries:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(e.get("at") or 0)))
        detail = ", ".join(f"{k}={v}" for k, v in sorted((e.get("detail") or {}).items()))
        lines.append(
            f"{indent}{at}  {e.get('action')} {e.get('name')!r} by {e.get('user')}@"
            f"{e.get('host')}" + (f"  ({detail})" if detail else "")
        )
    return "\n".join(lines)
