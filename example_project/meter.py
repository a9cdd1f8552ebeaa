"""An independent count of what the simulated services serve at once.

Each call into a service (:mod:`example_project.services`) goes through :func:`serving`, which
adds the call's units to a counter of its own in Redis on entry and takes them off on exit, in
one small script that also appends an event to a log.  Nothing here reads or trusts the
semaphore: the demo checks the semaphore against this count, like a real gateway would count
the calls it receives.

Event format (one string per entry/exit, in the order Redis applied them)::

    <unix time> <meter> <queue> <task name> <task id> <+units|-units> <in use> <in use by queue>
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import redis

_ENTER_EXIT = """
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[3])
local q = redis.call('HINCRBY', KEYS[1], ARGV[1] .. ' ' .. ARGV[2], ARGV[3])
redis.call('RPUSH', KEYS[2], table.concat(
    {ARGV[4], ARGV[1], ARGV[2], ARGV[5], ARGV[6], ARGV[3], n, q}, ' '))
return n
"""

_client: redis.Redis | None = None
_pid = -1


def keys(prefix: str) -> tuple[str, str]:
    """The meter's two keys under ``prefix``: the counters (a hash) and the event log."""
    return f"{prefix}:meter:inside", f"{prefix}:meter:events"


def _redis() -> redis.Redis:
    from . import celeryconfig  # not at import: the demo imports this module before it

    global _client, _pid
    if _client is None or _pid != os.getpid():  # a forked pool child gets its own connection
        _client, _pid = redis.Redis.from_url(celeryconfig.redis_url), os.getpid()
    return _client


def _current_task() -> tuple[str, str, str]:
    """(queue, task name, task id) of the task this process is running, if any."""
    from celery import current_task

    task = current_task
    if task is None or not task.request.id:
        return "-", "-", "-"
    queue = (task.request.delivery_info or {}).get("routing_key") or "-"
    return str(queue), str(task.name), str(task.request.id)


def _record(meter: str, units: int) -> None:
    from . import celeryconfig

    queue, name, task_id = _current_task()
    _redis().eval(
        _ENTER_EXIT,
        2,
        *keys(celeryconfig.key_prefix),
        meter,
        queue,
        str(units),
        f"{time.time():.6f}",
        name,
        task_id,
    )


@contextmanager
def serving(meter: str, units: int = 1) -> Iterator[None]:
    """Count ``units`` as in use by ``meter`` for the duration of the block."""
    _record(meter, units)
    try:
        yield
    finally:
        _record(meter, -units)


@dataclass(frozen=True)
class Event:
    at: float
    meter: str
    queue: str
    task: str
    task_id: str
    delta: int
    in_use: int
    in_use_by_queue: int

    @classmethod
    def parse(cls, raw: bytes | str) -> Event:
        text = raw.decode() if isinstance(raw, bytes) else raw
        at, meter, queue, task, task_id, delta, n, q = text.split(" ")
        return cls(float(at), meter, queue, task, task_id, int(delta), int(n), int(q))


def read_events(client: redis.Redis, prefix: str, start: int = 0) -> list[Event]:
    """The events logged since index ``start``."""
    return [Event.parse(raw) for raw in client.lrange(keys(prefix)[1], start, -1)]
