"""Measuring fair sharing from the independent ledgers of a run (tests and benchmark).

Every task's send time is taken by the sender; its body records when it started and finished
(``time.time()`` on one host, see :class:`tests.integration.proj.Body`) and its grant's fencing
token.  From those, on the timeline of the run:

* a task *waits* from its send to its start, and *uses* its units from its start to its finish;
* :func:`usage_while_all_wait` averages each partition's units in use over the time during
  which every partition has waiters (where fair sharing decides who runs);
* :func:`jain` is Jain's fairness index, (sum x)^2 / (n * sum x^2): 1.0 when equal, 1/n when
  one partition has everything;
* :func:`inversions` counts pairs granted against their send order within a partition.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .helpers import _text, finished_at, started_at
from .workers import Env

__all__ = [
    "Sample",
    "collect",
    "inversions",
    "jain",
    "percentile",
    "usage_between",
    "usage_while_all_wait",
]


@dataclass(frozen=True)
class Sample:
    tag: str
    partition: str
    sent: float
    started: float
    finished: float
    fencing: int
    node: str

    @property
    def wait(self) -> float:
        return self.started - self.sent


def collect(env: Env, sent: Mapping[str, tuple[str, float]]) -> list[Sample]:
    """Join the sender's ``tag -> (partition, send time)`` with the bodies' ledgers."""
    starts, ends = started_at(env), finished_at(env)
    grants = {}
    for raw in env.redis().lrange(f"{env.prefix}:grants", 0, -1):
        tag, token, _queue, node = _text(raw).split("|")
        grants[tag] = (int(token), node)
    return [
        Sample(tag, part, at, starts[tag], ends[tag], *grants[tag])
        for tag, (part, at) in sent.items()
    ]


def usage_while_all_wait(
    samples: Iterable[Sample], partitions: Sequence[str], weights: Mapping[str, int] | None = None
) -> tuple[dict[str, float], float]:
    """Each partition's mean units in use (weights: units per task, default 1) over the time
    every partition in ``partitions`` has a waiter; and that time in seconds."""
    events: list[tuple[float, str, str, int]] = []
    for s in samples:
        units = (weights or {}).get(s.partition, 1)
        events += [(s.sent, "wait", s.partition, 1), (s.started, "wait", s.partition, -1)]
        events += [(s.started, "use", s.partition, units), (s.finished, "use", s.partition, -units)]
    events.sort(key=lambda e: e[0])
    waiting = dict.fromkeys(partitions, 0)
    using = dict.fromkeys(partitions, 0)
    area = dict.fromkeys(partitions, 0.0)
    span = 0.0
    last = events[0][0] if events else 0.0
    for at, kind, part, delta in events:
        if at > last and all(waiting[p] > 0 for p in partitions):
            for p in partitions:
                area[p] += using[p] * (at - last)
            span += at - last
        last = at
        if part in waiting:
            (waiting if kind == "wait" else using)[part] += delta
    return ({p: area[p] / span if span else 0.0 for p in partitions}, span)


def usage_between(samples: Iterable[Sample], start: float, end: float) -> dict[str, float]:
    """Each partition's mean units in use (bodies running) from ``start`` to ``end``."""
    out: dict[str, float] = {}
    for s in samples:
        overlap = min(s.finished, end) - max(s.started, start)
        if overlap > 0:
            out[s.partition] = out.get(s.partition, 0.0) + overlap
    return {p: v / (end - start) for p, v in out.items()}


def jain(values: Sequence[float]) -> float:
    total, squares = sum(values), sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _lines(samples: Iterable[Sample]) -> list[list[Sample]]:
    """Samples per (partition, node), in grant (fencing) order."""
    by_part: dict[tuple[str, str], list[Sample]] = {}
    for s in samples:
        by_part.setdefault((s.partition, s.node), []).append(s)
    return [sorted(group, key=lambda s: s.fencing) for group in by_part.values()]


def inversions(samples: Iterable[Sample], order: Mapping[str, int]) -> int:
    """Pairs of one partition granted (fencing order) against their ``order`` (send order),
    counted per worker node: a node receives a queue's messages in send order and puts them in
    line in that order, but two nodes may overtake each other on the way to Redis."""
    count = 0
    for line in _lines(samples):
        ranks = [order[s.tag] for s in line]
        count += sum(1 for i, a in enumerate(ranks) for b in ranks[i + 1 :] if b < a)
    return count
