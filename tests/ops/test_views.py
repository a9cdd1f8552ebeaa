"""Partition data is shown (``Snapshot.partitions``, ``WaiterInfo.partition``), and the wait
estimate uses the core's hold-time average when there is one.  The snapshots here are built
by hand (the same paths against the real core: test_cli.py, test_metrics.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from celery import Celery

from celery_semaphore.core.semaphore import HolderInfo, PartitionInfo, Snapshot, WaiterInfo
from celery_semaphore.ops import cli_render, views
from celery_semaphore.ops.registry import Known


def Partition(name: str, used: int, waiters: int, cap: int | None) -> PartitionInfo:
    return PartitionInfo(name, used, waiters, cap, 1)


NOW = 1_000_000.0


def holder(task_id: str, age: float, weight: int = 1) -> HolderInfo:
    return HolderInfo(f"tok-{task_id}", weight, 1, NOW - age, 50.0, {"task_id": task_id})


def waiter(task_id: str, position: int, partition: str) -> WaiterInfo:
    return WaiterInfo(
        f"{task_id}:0", position, 1, NOW - 5, 30.0, True, {"task_id": task_id}, partition
    )


def snapshot(**extra: Any) -> Snapshot:
    return Snapshot(
        name="gpu",
        limit=4,
        limit_override=None,
        used=4,
        server_time=NOW,
        holders=[holder("h1", 10.0), holder("h2", 20.0), holder("h3", 30.0, 2)],
        waiters=[waiter("w1", 0, "video"), waiter("w2", 0, "audio")],
        partitions=[Partition("video", 3, 1, 3), Partition("audio", 1, 1, 1)],
        **extra,
    )


ENTRY = Known("gpu", {"proj.render": (4, 1)})


def test_partitions_are_listed_and_drawn() -> None:
    row = views.summary(ENTRY, snapshot())
    assert row["partitions"] == [
        {"name": "video", "cap": 3, "used": 3, "waiting": 1, "weight": 1},
        {"name": "audio", "cap": 1, "used": 1, "waiting": 1, "weight": 1},
    ]
    listing = cli_render.listing([row], "p")
    assert "gpu / partition video: used 3, cap 3, weight 1, waiting 1" in listing
    frame = cli_render.top_frame([row], "p", 1.0)
    video = next(line for line in frame.splitlines() if line.strip().startswith("video"))
    assert "[" + "#" * 30 + "]" in video
    assert "3/3" in video
    assert views.detail(ENTRY, snapshot())["waiter_list"][1]["partition"] == "audio"


def test_explain_names_the_partition_cap_and_uses_the_hold_average() -> None:
    why = views.explain(ENTRY, snapshot(hold_time_avg=8.0), "w2")
    assert why is not None
    assert why["cap"] == {
        "kind": "partition",
        "partition": "audio",
        "detail": {"name": "audio", "cap": 1, "used": 1, "waiting": 1, "weight": 1},
    }
    # nobody ahead in its partition, its own 1 unit, none free: 1 unit; 4 turn over per 8 s
    assert (why["ahead"], why["needed"], why["estimate"]) == ([], 1, 2.0)
    assert why["estimate_basis"] == "the average hold time of recent releases"
    assert "cap: partition audio: used 1, cap 1, weight 1, waiting 1" in cli_render.explanation(why)


def test_estimate_without_history_uses_the_holders_ages() -> None:
    why = views.explain(ENTRY, snapshot(), "w1")
    assert why is not None
    # mean age 20 s -> a hold taken as 40 s; 1 unit needed, 4 turn over per 40 s
    assert (why["needed"], why["hold_estimate"], why["estimate"]) == (1, 40.0, 10.0)
    assert "no hold-time history" in why["estimate_basis"]


def test_positions_count_within_the_partition() -> None:
    snap = snapshot()
    waiters = [waiter("v1", 0, "video"), waiter("a1", 0, "audio"), waiter("a2", 1, "audio")]
    why = views.explain(ENTRY, replace(snap, waiters=waiters), "a2")
    assert why is not None
    assert [w["task_id"] for w in why["ahead"]] == ["a1"]  # not v1: another partition's line


def test_the_collector_exports_partitions_and_the_cores_counters(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prometheus_client import CollectorRegistry

    from celery_semaphore.ops import metrics

    class Reader:  # stands for a Semaphore whose core reports partitions and counters
        def inspect(self) -> Snapshot:
            return snapshot(reclaimed_total=5, grants_total=42)

    collector = metrics.SemaphoreCollector(app)
    monkeypatch.setattr(collector, "_semaphore", lambda entry: Reader())
    registry = CollectorRegistry()
    registry.register(collector)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"semaphore": "alpha", **labels})

    assert value("celery_semaphore_partition_cap", partition="video") == 3
    assert value("celery_semaphore_partition_in_use", partition="video") == 3
    assert value("celery_semaphore_partition_waiting", partition="audio") == 1
    assert value("celery_semaphore_leases_expired_total") == 5
    assert value("celery_semaphore_grants_total") == 42
