"""The log line of a held task's first wait, rate-limited per semaphore."""

from __future__ import annotations

from ... import logs
from ...core import clock
from .entry import Entry

log_wait = logs.get("wait")

#: a held task's first wait is logged at INFO at most once per this many seconds per
#: semaphore (the others at DEBUG, counted in the next INFO line)
WAIT_INFO_EVERY = 10.0
#: semaphores whose last INFO wait line is remembered (the oldest is forgotten)
WAIT_INFO_NAMES = 1000


class WaitLog:
    """Logs the first wait of each held task (see :meth:`log`)."""

    def __init__(self) -> None:
        #: semaphore name -> (when its last wait was logged at INFO, waits logged at DEBUG
        #: only since then)
        self._wait_info: dict[str, tuple[float, int]] = {}

    def log(self, entry: Entry) -> None:
        """(Under the gate's lock) a held task's first wait: at DEBUG every time; at INFO the
        first wait of a semaphore, then at most one per :data:`WAIT_INFO_EVERY` seconds per
        semaphore, counting the waits logged at DEBUG only meanwhile (a flood of arrivals
        would otherwise log one INFO line per task)."""
        name = entry.sem.name
        now = clock.monotonic()
        found = self._wait_info.get(name)
        quiet = 0 if found is None else found[1]
        loud = found is None or now - found[0] >= WAIT_INFO_EVERY
        if found is not None and not loud:
            self._wait_info[name] = (found[0], quiet + 1)
        else:
            self._wait_info.pop(name, None)  # the least recently logged first
            self._wait_info[name] = (now, 0)
            if len(self._wait_info) > WAIT_INFO_NAMES:  # dynamic names: forget the oldest
                del self._wait_info[next(iter(self._wait_info))]
        (log_wait.info if loud else log_wait.debug)(
            "task %s waits (limit %d, position %s): held by a worker (this one), off the pool, "
            "until %s%s%s",
            entry.req.name,
            entry.sem.limit,
            entry.position,
            _until(entry),
            "" if entry.counted else " (semaphore_worker_hold is full: in the prefetch window)",
            f"; {quiet} more task(s) waited meanwhile (logged at DEBUG)" if loud and quiet else "",
            semaphore=name,
            task_id=entry.req.id,
        )


def _until(entry: Entry) -> str:
    """What ends ``entry``'s wait, for the log."""
    if not entry.ready:
        return "a pool slot is free for it (this worker's slots are busy)"
    if entry.retry_at:
        wait = max(0.0, entry.retry_at - clock.monotonic())
        return f"its rate window lets it start (in {wait:.1f}s)"
    return "a release wakes it"
