"""Why a task waits, in one vocabulary: ``show`` groups the waiters by partition (positions
count within a line) and says why each waits, its queue's cap included; ``explain`` says it in
one sentence first; ``top`` counts the waiters by reason and draws a partition without a cap
against the limit (no placeholder bar); the metrics count the waiters by reason.

Against the real Redis and the real core: alpha (limit 3) is full, bulk (cap 2) holds 2 of it,
interactive holds 1; bulk's b3, b4 and interactive's i2, i3 arrive in turn (b3, i2, b4, i3).
The last tests build snapshots by hand for a pause and a waiter nothing holds (which the core
grants or wakes at once).
"""

from __future__ import annotations

import json
from typing import Any

from celery import Celery
from prometheus_client import CollectorRegistry

from celery_semaphore.core.semaphore import PartitionInfo, Snapshot, WaiterInfo
from celery_semaphore.ops import cli_render, metrics, views
from celery_semaphore.ops.registry import Known
from tests.conftest import SemaphoreFactory

from .conftest import Cli


def owner(task_id: str) -> dict[str, Any]:
    return {"task_id": task_id, "task": "ops.one", "host": "w1@test", "pid": 4242}


def full_alpha(make_semaphore: SemaphoreFactory) -> Any:
    sem = make_semaphore("alpha", 3)

    def attempt(task_id: str, queue: str) -> Any:
        cap = 2 if queue == "bulk" else None
        return sem.try_acquire(
            f"{task_id}:0", owner=owner(task_id), place_ttl=60, partition=queue, partition_cap=cap
        )

    for task_id, queue in [("b1", "bulk"), ("b2", "bulk"), ("i1", "interactive")]:
        assert attempt(task_id, queue).permit is not None
    places = [attempt(t, q) for t, q in [("b3", "bulk"), ("i2", "interactive")]]
    places += [attempt(t, q) for t, q in [("b4", "bulk"), ("i3", "interactive")]]
    # the core agrees: positions count within each queue's line
    assert [p.position for p in places] == [0, 0, 1, 1]
    return sem


def test_show_groups_the_lines_and_says_why_each_waits(
    cli: Cli, make_semaphore: SemaphoreFactory
) -> None:
    full_alpha(make_semaphore)
    data = json.loads(cli("show", "alpha", "--json").stdout)
    reasons = {w["task_id"]: w["reason"] for w in data["waiter_list"]}
    assert {t: r["kind"] for t, r in reasons.items()} == {
        "b3": "cap",
        "b4": "cap",
        "i2": "units",
        "i3": "units",
    }
    assert reasons["b3"]["text"] == "queue bulk at its cap: 2 of 2 unit(s) in use"
    assert reasons["b4"]["text"] == (
        "queue bulk at its cap: 2 of 2 unit(s) in use; the 1 waiter(s) ahead of it in its "
        "line need 1 more"
    )
    assert reasons["i2"]["text"] == "semaphore full: 3 of 3 unit(s) in use, 0 free"
    # the former fields stay as they were (neither a rate nor a pause holds anyone)
    assert all(w["why"] is None for w in data["waiter_list"])
    assert data["waiting_by_reason"] == {
        "slot": 0,
        "pause": 0,
        "cap": 2,
        "units": 2,
        "rate": 0,
        "starting": 0,
    }

    text = cli("show", "alpha").stdout
    waiters = text.split("WAITERS (4)\n")[1].splitlines()
    bulk = waiters.index("  partition bulk: used 2, cap 2, weight 1, waiting 2")
    interactive = waiters.index("  partition interactive: used 1, cap -, weight 1, waiting 2")
    lines = {bulk: ["b3", "b4"], interactive: ["i2", "i3"]}
    for start, tasks in lines.items():
        assert waiters[start + 1].split()[:2] == ["POS", "TASK"]
        rows = [waiters[start + 2].split(), waiters[start + 3].split()]
        assert [(r[0], r[1]) for r in rows] == [("0", tasks[0]), ("1", tasks[1])]
    assert waiters[bulk + 2].endswith("queue bulk at its cap: 2 of 2 unit(s) in use")
    assert waiters[interactive + 2].endswith("semaphore full: 3 of 3 unit(s) in use, 0 free")


def test_explain_says_why_in_one_sentence_first(cli: Cli, make_semaphore: SemaphoreFactory) -> None:
    full_alpha(make_semaphore)
    [b4] = json.loads(cli("explain", "b4", "--json").stdout)
    assert b4["reason"]["kind"] == "cap"
    assert b4["sentence"] == (
        "task b4 (ops.one) waits for semaphore 'alpha' because its queue 'bulk' is at its cap "
        "(queue_limits): it holds 2 of its 2 unit(s), and it needs 1; the 1 waiter(s) ahead of "
        "it in its line need 1 more."
    )
    # the facts as before
    assert (b4["waiter"]["position"], [a["task_id"] for a in b4["ahead"]]) == (1, ["b3"])
    assert b4["cap"]["kind"] == "partition"
    text = cli("explain", "b4").stdout.splitlines()
    assert text[0] == b4["sentence"]
    assert text[1].startswith("  place in line: 1 in the line of queue 'bulk' (0 is the head);")

    i2 = cli("explain", "i2").stdout.splitlines()[0]
    assert i2 == (
        "task i2 (ops.one) waits for semaphore 'alpha' because the semaphore is full: 3 "
        "unit(s) of its limit 3 are in use and 0 free, and it needs 1."
    )


def test_top_counts_the_waiters_by_reason_and_draws_no_placeholder(
    cli: Cli, make_semaphore: SemaphoreFactory
) -> None:
    full_alpha(make_semaphore)
    frame = cli("top", "--iterations", "1", "--no-scan").stdout
    assert "?" not in frame
    [alpha] = [line for line in frame.splitlines() if line.startswith("alpha")]
    assert "4 waiting (oldest " in alpha
    assert "; 2 queue at its cap, 2 semaphore full)" in alpha
    [bulk] = [line for line in frame.splitlines() if line.startswith("  bulk")]
    assert "[" + "#" * 30 + "]  2/2 (cap) (at its cap)  2 waiting" in bulk
    [interactive] = [line for line in frame.splitlines() if line.startswith("  interactive")]
    assert "[" + "#" * 10 + "." * 20 + "]  1/3 (no cap)  2 waiting" in interactive


def test_the_metrics_count_the_waiters_by_reason(
    app: Celery, make_semaphore: SemaphoreFactory
) -> None:
    full_alpha(make_semaphore)
    registry = CollectorRegistry()
    registry.register(metrics.SemaphoreCollector(app))

    def value(reason: str) -> float | None:
        labels = {"semaphore": "alpha", "reason": reason}
        return registry.get_sample_value("celery_semaphore_waiting_by_reason", labels)

    assert {r: value(r) for r in views.REASONS} == {
        "slot": 0,
        "pause": 0,
        "cap": 2,
        "units": 2,
        "rate": 0,
        "starting": 0,
    }


NOW = 1000.0
ENTRY = Known("gpu", {"proj.render": (4, 1)})


def waiter(task_id: str, position: int, partition: str = "") -> WaiterInfo:
    return WaiterInfo(
        f"{task_id}:0", position, 1, NOW - 5, 30.0, True, {"task_id": task_id}, partition
    )


def test_a_pause_and_a_waiter_nothing_holds_have_their_reasons() -> None:
    paused = Snapshot(
        "gpu", 4, None, 2, NOW, waiters=[waiter("p1", 0), waiter("p2", 1)], paused_for=3.0
    )
    first, second = views.detail(ENTRY, paused)["waiter_list"]
    assert (first["reason"]["kind"], second["reason"]["kind"]) == ("pause", "pause")
    assert first["reason"]["text"] == first["why"]["text"]  # the head's own words, as before
    assert second["reason"]["ends_in"] == 3.0
    sentence = views.explain(ENTRY, paused, "p2")["sentence"]  # type: ignore[index]
    assert sentence == (
        "task p2 (?) waits for semaphore 'gpu' because an adaptive pause holds every start: "
        "the service it calls pushed back (throttled), and nobody starts for 3.0s."
    )

    free = Snapshot(
        "gpu",
        4,
        None,
        1,
        NOW,
        waiters=[waiter("s1", 0, "q")],
        partitions=[PartitionInfo("q", 1, 1, None, 1)],
    )
    [w] = views.detail(ENTRY, free)["waiter_list"]
    assert w["reason"]["kind"] == "starting"
    explained = views.explain(ENTRY, free, "s1")
    assert explained is not None
    assert explained["sentence"].startswith(
        "task s1 (?) waits for semaphore 'gpu', but nothing holds it any more: its units are free"
    )
    assert cli_render.explanation(explained).splitlines()[0] == explained["sentence"]


def test_a_waiter_its_worker_has_no_slot_for_says_so(
    cli: Cli, make_semaphore: SemaphoreFactory
) -> None:
    """A task a worker holds while other work fills its pool slots keeps its place without
    being granted (ready=False): show, explain and the counts say so, though units are free."""
    sem = make_semaphore("slotless", 3)
    held_by = {**owner("n1"), "held_by": "w1@test"}
    assert sem.try_acquire("n1:0", owner=held_by, place_ttl=60, ready=False).permit is None
    data = json.loads(cli("show", "slotless", "--json").stdout)
    [w] = data["waiter_list"]
    assert w["reason"]["kind"] == "slot"
    assert w["reason"]["text"] == "no free slot on w1@test: it keeps its place"
    assert data["waiting_by_reason"]["slot"] == 1
    sentence = cli("explain", "n1").stdout.splitlines()[0]
    assert "its worker (w1@test) has no free pool slot for it" in sentence, sentence
