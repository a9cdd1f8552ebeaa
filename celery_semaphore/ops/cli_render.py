"""Text rendering of :mod:`celery_semaphore.ops.views` dicts for ``celery semaphore``.

Names, task ids, tokens and owners (task, host) come from task arguments and from any producer:
every one is shown through :func:`~celery_semaphore.logs.printable` (a table cell through
:func:`.cli_text.cell`, a quoted name through ``repr``, which escapes the same characters), so
a control character is shown as ``\\x1b``, ``\\r``, ``\\n``, never interpreted by the terminal.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..logs import printable
from . import views
from .cli_text import (
    average_hold,
    cell,
    duration,
    effective_line,
    holders_table,
    limit_lines,
    limit_text,
    line_full_text,
    liveness_text,
    partition_line,
    partition_name,
    policy_lines,
    rate_line,
    reclaimed_text,
    table,
    tasks_text,
)

__all__ = [
    "audit_lines",
    "detail",
    "duration",
    "effective_line",
    "explanation",
    "limit_lines",
    "listing",
    "rate_line",
    "table",
    "top_frame",
]

BAR_WIDTH = 30


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
                cell(row["limit"]),
                row["source"],
                f"{row['used']}/{cell(row['limit'])}",
                row["holders"],
                row["waiting"],
                duration(row["oldest_wait"]) if row["waiting"] else "-",
                tasks_text(row["tasks"], 2),
            ]
        )
    out = [
        table(["NAME", "LIMIT", "FROM", "IN USE", "HOLDERS", "WAITING", "OLDEST", "TASKS"], body)
    ]
    for row in rows:
        for part in row["partitions"]:
            out.append(f"  {cell(row['name'])} / {partition_line(part)}")
        for line in limit_lines(row):
            out.append(f"  {cell(row['name'])} / {line}")
        if full := line_full_text(row):
            out.append(f"  {cell(row['name'])} / {full.removeprefix('; ')}")
    return "\n".join(out)


def detail(data: Mapping[str, Any]) -> str:
    lines = _detail_head(data)
    lines.append("")
    holders = data["holder_list"]
    lines.append(f"HOLDERS ({len(holders)})")
    if holders:
        lines.append(holders_table(holders))
    waiters = data["waiter_list"]
    lines.append(f"WAITERS ({len(waiters)})")
    if waiters:
        lines.append(_waiters_table(waiters, data.get("partitions") or []))
    actions = data.get("operator_actions") or []
    if actions:
        lines.append("RECENT OPERATOR ACTIONS")
        lines.append(audit_lines(actions, indent="  "))
    return "\n".join(lines)


def _detail_head(data: Mapping[str, Any]) -> list[str]:
    """``show``'s first lines: the limit, the units in use, the tasks, the counters, then the
    partitions and what else limits the starts."""
    effective = data.get("effective") or {}
    of = cell(data["limit"])
    if effective.get("lowered"):
        of = f"{effective['limit']} (the effective limit; the limit is {of})"
    throttles = int(effective.get("throttles_total") or 0)
    lines = [
        f"semaphore {data['name']!r}: limit {limit_text(data)}",
        f"in use: {data['used']} of {of} unit(s) by {data['holders']} "
        f"holder(s); {data['waiting']} waiting"
        + (f" (oldest {duration(data['oldest_wait'])})" if data["waiting"] else ""),
        f"tasks: {tasks_text(data['tasks'], 5)}",
        *policy_lines(data),
        f"held on average: {average_hold(data.get('hold_time_avg'))}; "
        f"{reclaimed_text(data)}; "
        f"{data.get('grants_total', 0)} permit(s) granted so far"
        + (
            f"; throttled {throttles} time(s), the last "
            f"{duration(effective.get('last_throttle_age'))} ago"
            if throttles
            else ""
        )
        + line_full_text(data),
    ]
    lines.extend(f"  {partition_line(part)}" for part in data["partitions"])
    lines.extend(f"  {line}" for line in limit_lines(data))
    return lines


def _waiters_table(waiters: Sequence[Mapping[str, Any]], parts: Sequence[Any] = ()) -> str:
    """The waiters, one table per partition's line (positions count within a line), each
    under a line naming the partition when there are several or it has a name; WHY IT WAITS:
    the waiter's reason (:mod:`.views_reason`)."""
    out = []
    groups = group_by_partition(waiters, parts)
    for name, line in groups:
        if len(groups) > 1 or name:
            part = next((p for p in parts if (p.get("name") or "") == name), {"name": name})
            out.append(f"  {partition_line(part)}")
        out.append(
            table(
                ["POS", "TASK ID", "TASK", "WEIGHT", "PRIO", "WAITED", "HOW", "WHY IT WAITS"],
                [
                    [
                        w["position"],
                        w["task_id"] or w["ticket"],
                        w["task"],
                        w["weight"],
                        w.get("priority", 0),
                        duration(w["waited"]),
                        _how(w),
                        _why(w),
                    ]
                    for w in line
                ],
                indent="    " if len(groups) > 1 or name else "  ",
            )
        )
    return "\n".join(out)


def group_by_partition(
    waiters: Sequence[Mapping[str, Any]], parts: Sequence[Mapping[str, Any]] = ()
) -> list[tuple[str, list[Mapping[str, Any]]]]:
    """The waiters by partition ("" the default one), each line by position: the partitions in
    the order the core reports them, then any other in order of first arrival."""
    lines: dict[str, list[Mapping[str, Any]]] = {}
    for part in parts:
        lines.setdefault(str(part.get("name") or ""), [])
    for w in waiters:
        lines.setdefault(str(w.get("partition") or ""), []).append(w)
    return [
        (name, sorted(line, key=lambda w: int(w["position"])))
        for name, line in lines.items()
        if line
    ]


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
        return f"held by {printable(w['held_by'])}"
    return str(w["how"])


def _why(w: Mapping[str, Any]) -> str | None:
    """Why it waits (its ``reason``), e.g. ``queue bulk at its cap: 2 of 2 unit(s) in use``
    or ``held by the rate 2/s: the window opens in 0.4s``; else its ``why`` (None: none)."""
    why = w.get("reason") or w.get("why")
    return None if not why else str(why["text"])


def explanation(r: Mapping[str, Any]) -> str:
    if r["state"] == "holding":
        return _holding(r)
    w = r["waiter"]
    how = _HOW_LONG.get(w["how"], cell(w["how"])).format(node=cell(w.get("held_by") or "?"))
    lines = [
        _first_line(r),
        f"  place in line: {w['position']}{_line_name(w)} (0 is the head); {len(r['ahead'])} "
        "waiter(s) "
        f"ahead need {r['ahead_units']} unit(s); it needs {w['weight']}"
        + (f"; its priority is {w['priority']} (0-9)" if w.get("priority") else ""),
        f"  cap: {_cap_text(r)}",
        f"  in use: {r['used']} unit(s), free now: {r['free']}; units to come free before "
        f"its turn: {r['needed']}",
        f"  waiting for {duration(w['waited'])}, {how}",
    ]
    lines.extend(f"  {line}" for line in limit_lines(r))
    lines.extend(_why_lines(r))
    if r["ahead"]:
        lines.append("  ahead of it:")
        lines.append(_ahead_table(r["ahead"]))
    if r["holders"]:
        lines.append("  holding now:")
        lines.append(_holding_now_table(r["holders"]))
    lines.append(f"  estimate: {_estimate(r)}")
    return "\n".join(lines)


def _first_line(r: Mapping[str, Any]) -> str:
    """The one sentence that says why the task waits (its ``reason``; the ``sentence`` of the
    JSON, with the task's id and name escaped), or, from a result without a reason, that it
    is waiting."""
    w, reason = r["waiter"], r.get("reason")
    who = f"task {cell(r['task_id'])} ({cell(w['task'] or '?')})"
    if not reason:
        return f"{who} is waiting for semaphore {r['name']!r}"
    link = ", but" if reason["kind"] == views.STARTING else " because"
    return f"{who} waits for semaphore {r['name']!r}{link} {reason['because']}."


def _holding(r: Mapping[str, Any]) -> str:
    """``explain`` for a task that holds the semaphore."""
    h = r["holding"][0]
    return (
        f"task {cell(r['task_id'])} ({cell(h['task'] or '?')}) holds semaphore "
        f"{r['name']!r}: token {cell(h['token'])}, {h['weight']} unit(s), for "
        f"{duration(h['age'])} on {cell(h['host'])} (pid {cell(h['pid'])}), lease left "
        f"{duration(h['lease_left'])}, liveness: {liveness_text(h)}.\nIt is not waiting for "
        "this semaphore."
    )


def _line_name(w: Mapping[str, Any]) -> str:
    """`` in the line of queue 'bulk'`` (nothing for the default partition): whose line a
    position counts in."""
    name = w.get("partition")
    return f" in the line of queue {name!r}" if name else ""


def _cap_text(r: Mapping[str, Any]) -> str:
    """The cap a waiter counts against: its partition's, the effective limit or the limit."""
    cap = r["cap"]
    if cap["kind"] == "partition":
        return partition_line(cap["detail"])
    if (r.get("effective") or {}).get("lowered"):
        return (
            f"the semaphore's effective limit, {r['effective']['limit']} (lowered by throttles; "
            f"the limit is {limit_text(r)})"
        )
    return f"the semaphore's limit, {limit_text(r)}"


def _why_lines(r: Mapping[str, Any]) -> list[str]:
    """What holds the waiter (a pause, the rate) and the head of its line, when not units."""
    lines = []
    w, why = r["waiter"], r.get("why")
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
    return lines


def _ahead_table(ahead: Sequence[Mapping[str, Any]]) -> str:
    return table(
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
            for a in ahead
        ],
        indent="    ",
    )


def _holding_now_table(holders: Sequence[Mapping[str, Any]]) -> str:
    return table(
        ["TASK ID", "TASK", "HOST", "WEIGHT", "AGE", "LEASE LEFT", "LIVENESS"],
        [
            [
                h["task_id"],
                h["task"],
                h["host"],
                h["weight"],
                duration(h["age"]),
                duration(h["lease_left"]),
                liveness_text(h),
            ]
            for h in holders
        ],
        indent="    ",
    )


def _estimate(r: Mapping[str, Any]) -> str:
    """``about 12.3s (rough; ...)``, ``now (...)`` or ``unknown (...)``, with its basis."""
    if r["estimate"] is None:
        return f"unknown ({r['estimate_basis']})"
    if r["needed"]:
        return (
            f"about {duration(r['estimate'])} (rough; a hold taken as "
            f"{duration(r['hold_estimate'])}: {r['estimate_basis']})"
        )
    if r["estimate"] > 0:  # units are free; the rate is what it waits for
        return f"about {duration(r['estimate'])} ({r['estimate_basis']})"
    return f"now ({r['estimate_basis']})"


def _bar(used: int, limit: int | None, width: int = BAR_WIDTH) -> str:
    """``[###...]``: ``used`` of ``limit``; blank (no bar, the same width) when there is no
    limit to draw against."""
    if not limit:
        return " " * (width + 2)
    filled = min(width, round(width * used / limit))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def top_frame(rows: Sequence[Mapping[str, Any]], prefix: str, interval: float) -> str:
    stamp = time.strftime("%H:%M:%S")
    lines = [
        f"celery semaphore top  prefix {prefix!r}  {stamp}  (every {interval:g}s, Ctrl-C quits)"
    ]
    if not rows:
        lines.append("no semaphores known")
    names = [cell(r["name"]) for r in rows]
    width = max((len(n) for n in names), default=4)
    for r, shown in zip(rows, names, strict=True):
        waiting = f"{r['waiting']} waiting" + (
            f" (oldest {duration(r['oldest_wait'])}{_by_reason(r)})" if r["waiting"] else ""
        )
        in_use = f"{r['used']}/{r['limit']}" if r["limit"] is not None else f"{r['used']}"
        lines.append(
            f"{shown.ljust(width)}  {_bar(r['used'], r['limit'])}  "
            f"{in_use} in use  {waiting}  limit from {r['source']}"
        )
        for part in r["partitions"]:
            lines.append(_top_partition(part, r, width))
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


def _by_reason(r: Mapping[str, Any]) -> str:
    """``; 2 queue at its cap, 1 semaphore full``: the waiters by reason (none: "")."""
    counts = r.get("waiting_by_reason") or {}
    shown = [f"{n} {views.reason_label(kind)}" for kind, n in counts.items() if n]
    return f"; {', '.join(shown)}" if shown else ""


def _top_partition(part: Mapping[str, Any], r: Mapping[str, Any], width: int) -> str:
    """A partition's line in ``top``: its units against its cap, or, without a cap, against
    the limit it may take all of (saying "no cap")."""
    used = int(part.get("used") or 0)
    cap = part.get("cap", part.get("limit"))
    name = "  " + partition_name(part)
    waiting = f"{part.get('waiting', 0)} waiting"
    if isinstance(cap, int):
        full = " (at its cap)" if used >= cap and part.get("waiting") else ""
        return f"{name:<{width}}  {_bar(used, cap)}  {used}/{cap} (cap){full}  {waiting}"
    limit = (r.get("effective") or {}).get("limit") or r.get("limit")
    bar = _bar(used, limit if isinstance(limit, int) else None)
    of = f"/{limit}" if isinstance(limit, int) else ""
    return f"{name:<{width}}  {bar}  {used}{of} (no cap)  {waiting}"


def audit_lines(entries: Sequence[Mapping[str, Any]], indent: str = "") -> str:
    lines = []
    for e in entries:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(e.get("at") or 0)))
        detail = ", ".join(
            f"{printable(k)}={printable(v)}" for k, v in sorted((e.get("detail") or {}).items())
        )
        lines.append(
            f"{indent}{at}  {printable(e.get('action'))} {e.get('name')!r} by "
            f"{printable(e.get('user'))}@{printable(e.get('host'))}"
            + (f"  ({detail})" if detail else "")
        )
    return "\n".join(lines)
