"""Which held tasks the gate makes ready (a free pool slot set aside for each): the first ones
in line, as the semaphore orders it (arrival moved earlier by ``priority * priority_step``),
not the first to arrive at this worker.

A task that arrives with a high priority while the ready tasks take every free slot used to
stay not ready behind later-placed ready ones, and a release granted one of those before it
(``test_priority_full``: ``['blocker', 'low1', 'high', ...]``).
"""

from __future__ import annotations

from dataclasses import dataclass

from celery_semaphore.integration import readiness

STEP = 60.0  # the default priority_step


@dataclass(eq=False)
class Held:
    tag: str
    since: float
    priority: int = 0
    ready: bool = False
    busy: bool = False
    group: tuple[str, str] = ("s", "")

    @property
    def order(self) -> float:
        return self.since - self.priority * STEP


def _line(ready: int) -> list[Held]:
    """Four tasks of priority 0 (the first ``ready`` of them ready), then one of priority 9."""
    lows = [Held(f"low{i}", since=float(i), ready=i < ready) for i in range(4)]
    return [*lows, Held("high", since=10.0, priority=9)]


def _tags(entries: list[Held]) -> list[str]:
    return [e.tag for e in entries]


def test_pick_makes_the_first_in_line_ready_priority_counted() -> None:
    assert _tags(readiness.pick(_line(ready=0), 3)) == ["high", "low0", "low1"]
    assert _tags(readiness.pick(_line(ready=1), 3)) == ["high", "low1"]


def test_pick_leaves_busy_tasks_and_counts_busy_ready_ones() -> None:
    line = _line(ready=1)
    line[0].busy = True  # ready and busy: it still takes a slot
    line[4].busy = True  # not ready and busy: left alone
    assert _tags(readiness.pick(line, 3)) == ["low1", "low2"]


def test_a_high_priority_task_takes_the_place_of_the_latest_ready_one() -> None:
    line = _line(ready=3)
    assert readiness.pick(line, 3) == []
    pairs = readiness.swaps(line, 3)
    assert [(a.tag, b.tag) for a, b in pairs] == [("high", "low2")]


def test_no_swap_while_the_ready_ones_come_first() -> None:
    line = _line(ready=3)
    line[4].priority = 0  # the last one in line: nothing to swap
    assert readiness.swaps(line, 3) == []
    assert readiness.swaps(_line(ready=0), 3) == []  # pick() makes them ready: no swap


def test_swaps_pass_over_busy_and_unmovable_ready_tasks() -> None:
    line = _line(ready=3)
    line[2].busy = True
    assert [(a.tag, b.tag) for a, b in readiness.swaps(line, 3)] == [("high", "low1")]
    pairs = readiness.swaps(line, 3, movable=lambda e: e.tag != "low1")
    assert [(a.tag, b.tag) for a, b in pairs] == [("high", "low0")]


def test_several_swaps_in_order_and_lines_apart() -> None:
    early = [Held(f"hi{i}", since=20.0 + i, priority=9) for i in range(2)]
    other = [
        Held("o0", since=0.0, ready=True, group=("t", "")),
        Held("o1", since=1.0, group=("t", "")),
    ]
    line = [*_line(ready=3), *early, *other]
    pairs = readiness.swaps(line, 3)
    assert [(a.tag, b.tag) for a, b in pairs] == [
        ("high", "low2"),
        ("hi0", "low1"),
        ("hi1", "low0"),
    ]


def test_surplus_unreadies_the_last_in_line() -> None:
    line = _line(ready=2)
    line[4].ready = True
    assert _tags(readiness.surplus(line, 2)) == ["low1"]
    assert _tags(readiness.surplus(line, 0)) == ["high", "low0", "low1"]
