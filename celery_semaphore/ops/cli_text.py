"""Text primitives of ``celery semaphore``'s output: a cell, a table, a duration, and the
one-line forms of a limit, a partition, a rate window and an effective limit.
:mod:`.cli_render` builds the commands' output from them (and re-exports the public ones).

Every name, task id, token and owner goes through :func:`cell` (or ``repr``), which escapes
control characters (:func:`~celery_semaphore.logs.printable`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..logs import printable
from . import views

__all__ = [
    "average_hold",
    "cell",
    "duration",
    "effective_line",
    "holders_table",
    "line_full_text",
    "policy_lines",
    "limit_lines",
    "limit_text",
    "liveness_text",
    "partition_line",
    "partition_name",
    "rate_line",
    "reclaimed_text",
    "table",
    "tasks_text",
]


def duration(seconds: float | None) -> str:
    """``0.4s``, ``12.3s``, ``5m03s``, ``2h05m``; ``-`` for None."""
    return "-" if seconds is None else views.seconds_text(seconds)


def average_hold(seconds: float | None) -> str:
    """The average hold of recent releases, or why there is none."""
    if seconds is None:
        return "- (nothing released yet)"
    return f"{duration(seconds)} (recent releases)"


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return printable(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], indent: str = "") -> str:
    cells = [[cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [
        indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [list(headers), *cells]
    ]
    return "\n".join(lines)


def tasks_text(names: Sequence[str], most: int) -> str:
    """The first ``most`` task names, then how many more (``--json`` lists them all)."""
    if not names:
        return "-"
    shown = ", ".join(printable(n) for n in names[:most])
    return shown + (f" (+{len(names) - most} more)" if len(names) > most else "")


def limit_text(row: Mapping[str, Any]) -> str:
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
    return f"{cell(row['limit'])} ({row['source']}{extra})"


def partition_name(part: Mapping[str, Any]) -> str:
    name = printable(part.get("name", "?"))
    return name or "(default)"  # the core calls the default partition ""


def partition_line(part: Mapping[str, Any]) -> str:
    name = partition_name(part)
    rest = ", ".join(
        f"{k} {cell(v)}" for k, v in part.items() if k != "name" and not isinstance(v, (list, dict))
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


def line_full_text(data: Mapping[str, Any]) -> str:
    """``; line full (max_waiting): 3 refused, 1 dropped for a newer task``, or ""."""
    full, dropped = int(data.get("full_total") or 0), int(data.get("dropped_total") or 0)
    text = f"; line full (max_waiting): {full} refused, {dropped} dropped for a newer task"
    return text if full or dropped else ""


def policy_lines(data: Mapping[str, Any]) -> list[str]:
    """``show``'s line per task with a priority or a bounded line (``line_policies``)."""
    return [
        f"  {p['task']}: priority {p['priority']}, max_waiting {p['max_waiting']}, "
        f"on_full {p['on_full']}"
        for p in data.get("line_policies") or ()
    ]


def liveness_text(holder: Mapping[str, Any]) -> str:
    """A holder's process liveness (:func:`.views.liveness_state`): ``alive (record expires in
    2.1s)``, ``process record expired 3.0s ago: reclaimed at the next call``, ``process record
    gone: reclaimed at the next call``, or ``-`` (no record: only the lease brings it back)."""
    state, left = holder.get("liveness"), holder.get("liveness_left")
    if state == "alive":
        return f"alive (record expires in {duration(left)})"
    if state == "expired" and left is not None:
        return f"process record expired {duration(-left)} ago: reclaimed at the next call"
    if state in ("expired", "gone"):
        return "process record gone: reclaimed at the next call"
    return "-"


def reclaimed_text(data: Mapping[str, Any]) -> str:
    """``3 lease(s) expired and taken back``, then ``, 2 permit(s) of dead processes`` when
    liveness records expired (``died_total``, counted in ``reclaimed_total``)."""
    died = int(data.get("died_total") or 0)
    expired = int(data.get("reclaimed_total") or 0) - died
    text = f"{expired} lease(s) expired and taken back"
    return text + (f", {died} permit(s) of dead processes (liveness)" if died else "")


#: ``show``'s holder columns before the process and its liveness
HOLDER_COLUMNS = ("TOKEN", "TASK ID", "TASK", "HOST", "PID", "WEIGHT", "AGE", "LEASE LEFT", "FENCE")


def holders_table(holders: Sequence[Mapping[str, Any]]) -> str:
    """``show``'s holders, a row each, with its process and liveness (:func:`liveness_text`)."""
    return table(
        [*HOLDER_COLUMNS, "PROCESS", "LIVENESS"],
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
                h.get("process"),
                liveness_text(h),
            ]
            for h in holders
        ],
        indent="  ",
    )
