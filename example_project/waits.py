"""Tasks waiting over time, for the demo's plot: a task waits from the moment it is sent until
its body starts (as the summary's wait times count it: queued -> body started), on the queue it
was sent to, for the semaphore whose service it then calls.

The times come from the demo's own records (when it sent each task, and the meter's entry
event when the body started), not from the semaphore. A task whose body never started (a run
that did not finish) is not drawn: which semaphore it waited for is not known.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from .meter import Event


def waiting_steps(
    sent: Mapping[str, Any], events: Iterable[Event], started: float
) -> dict[tuple[str, str], list[tuple[float, int]]]:
    """(semaphore, queue) -> tasks waiting over time, as steps: (seconds since ``started``,
    count from then on). ``sent``: task id -> its record (``.queue``, ``.at``)."""
    entry: dict[str, Event] = {}
    for event in events:
        if event.delta > 0:
            entry.setdefault(event.task_id, event)  # the body's start, and its meter
    changes: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    for task_id, record in sent.items():
        first = entry.get(task_id)
        if first is None:
            continue
        key = (first.meter, str(record.queue))
        changes[key].append((record.at - started, 1))
        changes[key].append((max(record.at, first.at) - started, -1))
    steps: dict[tuple[str, str], list[tuple[float, int]]] = {}
    for key, deltas in changes.items():
        count, line = 0, list[tuple[float, int]]()
        # at the same instant, a start before a send: no spike that never was
        for at, delta in sorted(deltas):
            count += delta
            if line and line[-1][0] == at:
                line[-1] = (at, count)
            else:
                line.append((at, count))
        steps[key] = line
    return steps
