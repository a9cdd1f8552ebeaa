"""The demo's verdict, from made-up meter events: a limit or a queue cap exceeded, a leaked
permit or unfinished work is never reported as held; and the live view redraws in place only
on a terminal."""

from __future__ import annotations

import io

import redis

from example_project.demo import Limit, LiveView, Run, Sent, render_summary, summarize
from example_project.meter import Event


def run_with(events: list[tuple[str, str, int]], limit: Limit) -> Run:
    """A run whose meter saw ``(queue, task id, units)`` entries (positive) and exits
    (negative), in order."""
    run = Run(redis.Redis(), "prefix", [limit], started=100.0)
    in_use: dict[str, int] = {}
    total = 0
    recorded = []
    for i, (queue, task_id, delta) in enumerate(events):
        total += delta
        in_use[queue] = in_use.get(queue, 0) + delta
        if delta > 0:
            run.sent.setdefault(task_id, Sent("charge", queue, 100.0))
        at = 100.0 + i
        recorded.append(
            Event(at, limit.name, queue, "charge", task_id, delta, total, in_use[queue])
        )
    run.record(recorded)
    return run


def verdict(run: Run, leaked: int = 0) -> dict[str, object]:
    summary = summarize(run, {run.limits[0].name: leaked}, 10.0)
    return {"ok": summary["ok"], **summary["limits"][0]}


def test_within_the_limit_and_the_cap_is_held() -> None:
    limit = Limit("payment-gateway", 3, {"bulk": 2})
    events = [("bulk", "a", 1), ("bulk", "b", 1), ("interactive", "c", 1)]
    events += [("bulk", "a", -1), ("bulk", "b", -1), ("interactive", "c", -1)]
    result = verdict(run_with(events, limit))
    assert result["limit_kept"] is True
    assert result["held"] is True  # the former name, kept for readers of the JSON
    assert result["ok"] is True
    assert result["peak"] == 3
    assert result["tasks_done"] == 3


def test_over_the_limit_is_not_held() -> None:
    limit = Limit("gpu", 4)
    events = [("bulk", "a", 2), ("bulk", "b", 2), ("interactive", "c", 1)]
    events += [("bulk", "a", -2), ("bulk", "b", -2), ("interactive", "c", -1)]
    result = verdict(run_with(events, limit))
    assert result["peak"] == 5
    assert (result["limit_kept"], result["held"]) == (False, False)
    assert result["ok"] is False


def test_over_a_queue_cap_is_not_held_even_within_the_limit() -> None:
    limit = Limit("payment-gateway", 3, {"bulk": 2})
    events = [("bulk", "a", 1), ("bulk", "b", 1), ("bulk", "c", 1)]
    events += [("bulk", "a", -1), ("bulk", "b", -1), ("bulk", "c", -1)]
    result = verdict(run_with(events, limit))
    assert result["peak"] == 3
    assert (result["limit_kept"], result["held"]) == (False, False)
    assert result["ok"] is False


def test_a_leaked_permit_or_unfinished_work_fails_the_run() -> None:
    limit = Limit("payment-gateway", 3)
    done = [("bulk", "a", 1), ("bulk", "a", -1)]
    assert verdict(run_with(done, limit), leaked=1)["ok"] is False
    summary = summarize(run_with([("bulk", "a", 1)], limit), {}, 10.0)  # never left
    assert summary["complete"] is False
    assert summary["ok"] is False


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_live_view_redraws_in_place_only_on_a_terminal() -> None:
    plain = io.StringIO()
    view = LiveView(plain)
    view.show(["a", "b"])
    view.show(["c", "d"])
    assert plain.getvalue() == "a\nb\nc\nd\n"
    term = Terminal()
    view = LiveView(term)
    view.show(["a", "b"])
    view.show(["c", "d"])
    assert term.getvalue() == "a\nb\n\x1b[2F\x1b[Jc\nd\n"  # up 2 lines, clear, redraw


def test_the_table_names_its_columns_so_they_cannot_be_misread() -> None:
    """ "limit kept" (the limit and the caps were never exceeded), not "held" (which reads as
    "a permit is still held"); "permits leaked", not "leaked"; each explained under the table."""
    limit = Limit("payment-gateway", 3, {"bulk": 2})
    kept = run_with([("bulk", "a", 1), ("bulk", "a", -1)], limit)
    over = run_with([("bulk", "a", 1), ("bulk", "b", 1), ("bulk", "c", 1)], limit)
    for run, word in ((kept, "yes"), (over, "NO")):
        text = render_summary(summarize(run, {}, 10.0))
        header = next(line for line in text.splitlines() if line.startswith("semaphore"))
        assert header.split()[-4:] == ["permits", "leaked", "limit", "kept**"]
        assert " held" not in header
        row = next(line for line in text.splitlines() if line.startswith("payment-gateway"))
        assert row.split()[-2:] == ["0", word]
        assert (
            "** yes: the limit and every queue cap were never exceeded; permits leaked: "
            "permits still held after all the work was done"
        ) in text
