"""Reading the independent bookkeeping and the semaphore's state after a run."""

from __future__ import annotations

import threading
import time
from typing import Any

from celery_semaphore import HolderInfo, Semaphore

from .workers import Env


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def started(env: Env) -> list[str]:
    """Tags in the order their bodies started."""
    return [_text(x).split(":")[0] for x in env.redis().lrange(f"{env.prefix}:started", 0, -1)]


def max_inside(env: Env, name: str = "main") -> int:
    return int(env.redis().get(f"{env.prefix}:max:{name}") or 0)


def inside(env: Env, name: str = "main") -> int:
    return int(env.redis().get(f"{env.prefix}:inside:{name}") or 0)


def ran(env: Env) -> list[str]:
    return [_text(x) for x in env.redis().lrange(f"{env.prefix}:ran", 0, -1)]


def ledger(env: Env, key: str) -> list[str]:
    """The bookkeeping list ``<prefix>:<key>``, as text."""
    return [_text(x) for x in env.redis().lrange(f"{env.prefix}:{key}", 0, -1)]


def semaphore(env: Env, name: str = "main", limit: int | None = None) -> Semaphore:
    return Semaphore(name, limit or env.limit, redis=env.redis_url, key_prefix=env.prefix)


def holders(env: Env, name: str = "main") -> list[Any]:
    return semaphore(env, name).holders()


BOOKKEEPING = (
    "inside:*",
    "max:*",
    "ran",
    "started",
    "finished",
    "pid:*",
    "unlimited",
    "attempts:*",
    "crashed:*",
)


def reset_bookkeeping(env: Env) -> None:
    """Forget the counters and ledgers, but not the semaphore's own state (its tombstones
    are what tell a late duplicate copy of a finished task to drop itself)."""
    r = env.redis()
    for pattern in BOOKKEEPING:
        for key in r.scan_iter(match=f"{env.prefix}:{pattern}"):
            r.delete(key)


def started_at(env: Env) -> dict[str, float]:
    """Tag -> epoch seconds its body started (the last start, if it ran more than once)."""
    return _times(env, "started")


def finished_at(env: Env) -> dict[str, float]:
    """Tag -> epoch seconds its body finished."""
    return _times(env, "finished")


def _times(env: Env, key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for entry in ledger(env, key):
        tag, _, at = entry.rpartition(":")
        out[tag] = float(at)
    return out


class HolderSampler:
    """Reads ``holders()`` in a background thread, over and over, until stopped: a record of
    who held what while a test ran (independent of the task bodies).  Samples are stamped
    with ``time.time()``, like the started/finished ledgers."""

    def __init__(self, env: Env, name: str = "main", interval: float = 0.02) -> None:
        self.sem = semaphore(env, name)
        self.interval = interval
        self.samples: list[tuple[float, list[HolderInfo]]] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="holder-sampler", daemon=True)

    def __enter__(self) -> HolderSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.time(), self.sem.holders()))
            except Exception as exc:  # recorded, and checked by the test
                self.errors.append(exc)
            self._stop.wait(self.interval)

    def of_task(self, task_id: str) -> list[tuple[float, list[HolderInfo]]]:
        """The samples, each cut down to the holders owned by ``task_id``."""
        return [(t, [h for h in hs if h.owner.get("task_id") == task_id]) for t, hs in self.samples]
