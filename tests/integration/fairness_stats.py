"""Measuring fair sharing from the independent ledgers of a run (tests and benchmark).

Every task's send time is taken by the sender; its body records when it started and finished
(``time.time()`` on one host, see :class:`tests.integration.proj.Body`) and its grant's fencing
token.  From those, on the timeline of the run:

* a task *waits* from its send to its start, and *uses* its units from its start to its finish;
* :class:`PartitionSampler` reads the semaphore's own partitions (units held, waiters) while
  a load runs, and averages each partition's units over the samples in which every partition
  has waiters (where fair sharing decides who runs); :func:`usage_between` averages the units
  in use by the bodies over a span of time;
* :func:`jain` is Jain's fairness index, (sum x)^2 / (n * sum x^2): 1.0 when equal, 1/n when
  one partition has everything;
* :func:`inversions` counts pairs granted against their send order within a partition.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from celery_semaphore import Semaphore

from .helpers import _text, finished_at, started_at
from .workers import Env

__all__ = [
    "PartitionSampler",
    "Sample",
    "collect",
    "inversions",
    "jain",
    "percentile",
    "usage_between",
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


@dataclass
class PartitionSampler:
    """Reads the semaphore's partitions (units each holds, waiters each has) in a background
    thread until stopped: the allocation as the semaphore made it, free of the delay between a
    grant and its body (which grows with CPU load and would blur a share measured from the
    bodies).  The limit itself is checked with the bodies' independent counter."""

    sem: Semaphore
    interval: float = 0.02
    samples: list[dict[str, tuple[int, int]]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> PartitionSampler:
        self._thread = threading.Thread(target=self._run, name="partition-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                snap = self.sem.inspect()
                self.samples.append({p.name: (p.used, p.waiters) for p in snap.partitions})
            except Exception as exc:  # recorded, and checked by the test
                self.errors.append(exc)
            self._stop.wait(self.interval)

    def used_while_all_wait(self, partitions: Sequence[str]) -> tuple[dict[str, float], int]:
        """Each partition's mean units held over the samples in which every one of
        ``partitions`` had waiters; and how many samples that was."""
        chosen = [s for s in self.samples if all(s.get(p, (0, 0))[1] > 0 for p in partitions)]
        if not chosen:
            return dict.fromkeys(partitions, 0.0), 0
        return {p: sum(s.get(p, (0, 0))[0] for s in chosen) / len(chosen) for p in partitions}, len(
            chosen
        )


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
