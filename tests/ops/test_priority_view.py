"""What the operator sees of priorities and a bounded line: each waiter's priority in ``show``
(text and JSON) and ``explain``, the semaphore's refused and dropped counts, and each task's
priority and policy when the line is full."""

from __future__ import annotations

import json
from typing import Any

from celery import Celery

from celery_semaphore import limited
from tests.conftest import SemaphoreFactory

from .conftest import Cli


def owner(task_id: str) -> dict[str, Any]:
    return {"task_id": task_id, "task": "ops.prio", "host": "w1@test", "pid": 7}


def test_show_and_explain_give_priority_and_line_full_counts(
    cli: Cli, make_semaphore: SemaphoreFactory
) -> None:
    sem = make_semaphore("prio-view", 1)
    assert sem.acquire(owner=owner("holder")) is not None
    sem.try_acquire("low:0", owner=owner("low"), place_ttl=60, max_waiting=2)
    sem.try_acquire("high:0", owner=owner("high"), place_ttl=60, priority=9, max_waiting=2)
    refused = sem.try_acquire("late:0", owner=owner("late"), place_ttl=60, max_waiting=2)
    assert refused.status.name == "FULL"
    sem.try_acquire("new:0", owner=owner("new"), place_ttl=60, max_waiting=2, keep_newest=True)

    data = json.loads(cli("show", "prio-view", "--json").stdout)
    # keep_newest dropped the front of the line: the priority-9 waiter
    assert [(w["task_id"], w["position"], w["priority"]) for w in data["waiter_list"]] == [
        ("low", 0, 0),
        ("new", 1, 0),
    ]
    assert (data["full_total"], data["dropped_total"]) == (1, 1)
    text = cli("show", "prio-view").stdout
    assert "line full (max_waiting): 1 refused, 1 dropped for a newer task" in text
    header = text.split("WAITERS (2)")[1].strip().splitlines()[0].split()
    assert header[:6] == ["POS", "TASK", "ID", "TASK", "WEIGHT", "PRIO"]
    listed = cli("list").stdout
    assert "prio-view / line full (max_waiting): 1 refused, 1 dropped for a newer task" in listed
    [row] = [r for r in json.loads(cli("list", "--json").stdout) if r["name"] == "prio-view"]
    assert (row["full_total"], row["dropped_total"]) == (1, 1)


def test_explain_names_a_waiters_priority(cli: Cli, make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("prio-explain", 1)
    assert sem.acquire(owner=owner("holder")) is not None
    sem.try_acquire("first:0", owner=owner("first"), place_ttl=60)
    sem.try_acquire("vip:0", owner=owner("vip"), place_ttl=60, priority=7)
    text = cli("explain", "vip").stdout
    assert "place in line: 0 (0 is the head)" in text
    assert "its priority is 7 (0-9)" in text
    data = json.loads(cli("show", "prio-explain", "--json").stdout)
    assert {w["task_id"]: w["priority"] for w in data["waiter_list"]} == {"vip": 7, "first": 0}


def test_show_names_each_tasks_priority_and_full_line_policy(
    app: Celery, cli: Cli, make_semaphore: SemaphoreFactory
) -> None:
    @app.task(name="ops.report", shared=False)
    @limited("reports", limit=1, priority=lambda a: 0, max_waiting=0, on_full="drop")
    def report() -> None: ...

    @app.task(name="ops.urgent", shared=False)
    @limited("reports", limit=1, priority=8)
    def urgent() -> None: ...

    make_semaphore("reports", 1).acquire(owner=owner("holder"))
    data = json.loads(cli("show", "reports", "--json").stdout)
    assert data["line_policies"] == [
        {"task": "ops.report", "priority": "per call", "max_waiting": 0, "on_full": "drop"},
        {"task": "ops.urgent", "priority": 8, "max_waiting": None, "on_full": "wait"},
    ]
    text = cli("show", "reports").stdout
    assert "  ops.report: priority per call, max_waiting 0, on_full drop" in text
