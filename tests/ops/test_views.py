"""Partition data is shown when the core reports it (``Snapshot.partitions``,
``WaiterInfo.partition``), and the wait estimate uses the core's hold-time average when there
is one.  The snapshots here are built by hand, in the shape the core is expected to grow."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from celery_semaphore import cli_render, views
from celery_semaphore.registry import Known
from celery_semaphore.semaphore import HolderInfo, Snapshot, WaiterInfo


@dataclass(frozen=True)
class Partition:
    name: str
    cap: int
    used: int
    waiting: int


@dataclass(frozen=True)
class PartitionedSnapshot(Snapshot):
    partitions: list[Partition] = field(default_factory=list)
    hold_time_avg: float | None = None


@dataclass(frozen=True)
class PartitionedWaiter(WaiterInfo):
    partition: str | None = None


NOW = 1_000_000.0


def holder(task_id: str, age: float, weight: int = 1) -> HolderInfo:
    return HolderInfo(f"tok-{task_id}", weight, 1, NOW - age, 50.0, {"task_id": task_id})


def waiter(task_id: str, position: int, partition: str) -> WaiterInfo:
    return PartitionedWaiter(
        f"{task_id}:0", position, 1, NOW - 5, 30.0, True, {"task_id": task_id}, partition
    )


def snapshot(**extra: Any) -> PartitionedSnapshot:
    return PartitionedSnapshot(
        name="gpu",
        limit=4,
        limit_override=None,
        used=4,
        server_time=NOW,
        holders=[holder("h1", 10.0), holder("h2", 20.0), holder("h3", 30.0, 2)],
        waiters=[waiter("w1", 0, "video"), waiter("w2", 1, "audio")],
        partitions=[Partition("video", 3, 3, 1), Partition("audio", 1, 1, 1)],
        **extra,
    )


ENTRY = Known("gpu", {"proj.render": (4, 1)})


def test_partitions_are_listed_and_drawn() -> None:
    row = views.summary(ENTRY, snapshot())
    assert row["partitions"] == [
        {"name": "video", "cap": 3, "used": 3, "waiting": 1},
        {"name": "audio", "cap": 1, "used": 1, "waiting": 1},
    ]
    listing = cli_render.listing([row], "p")
    assert "gpu / partition video: cap 3, used 3, waiting 1" in listing
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
        "detail": {"name": "audio", "cap": 1, "used": 1, "waiting": 1},
    }
    # 1 unit ahead + its own 1, none free: 2 units turn over at 4 per 8 s
    assert (why["needed"], why["estimate"]) == (2, 4.0)
    assert why["estimate_basis"] == "the average hold time of recent releases"
    assert "cap: partition audio: cap 1, used 1, waiting 1" in cli_render.explanation(why)


def test_estimate_without_history_uses_the_holders_ages() -> None:
    why = views.explain(ENTRY, snapshot(), "w1")
    assert why is not None
    # mean age 20 s -> a hold taken as 40 s; 1 unit needed, 4 turn over per 40 s
    assert (why["needed"], why["hold_estimate"], why["estimate"]) == (1, 40.0, 10.0)
    assert "no hold-time history" in why["estimate_basis"]
