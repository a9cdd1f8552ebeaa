"""Bookkeeping that survives the faults the chaos tests inject, and needs no Redis.

Both live in one directory per test (``CS_CHAOS_DIR`` in the workers):

* **The concurrency counter** (``inside.json``, guarded by ``inside.lock`` with ``flock``):
  the bodies inside right now, each with its pid, and the maximum seen.  A body killed by
  SIGKILL never leaves, so every entry counts only while its process is alive: the next
  ``enter`` drops the entries of dead processes.  The file is replaced atomically (write,
  then rename) and ``flock`` is released by the kernel when its holder dies, so a kill at
  any point never corrupts it nor blocks the others.
* **The ledger** (``ledger.log``): one line per body start and end, appended with
  ``O_APPEND`` in a single ``write`` of less than ``PIPE_BUF`` bytes (atomic, and on disk
  whatever kills the writer a moment later).

The semaphore's own state is never read here: this is the independent record the tests
compare it with.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Counts", "Entry", "Recorder", "read_ledger"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (killed, not reaped yet) is not running a body any more
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class Recorder:
    """The counter and the ledger in ``directory`` (used by the task bodies)."""

    def __init__(self, directory: str | Path, limit: int) -> None:
        self.dir = Path(directory)
        self.limit = limit
        self._lock = self.dir / "inside.lock"
        self._state = self.dir / "inside.json"
        self._ledger = self.dir / "ledger.log"

    def _append(self, *fields: object) -> None:
        line = " ".join(str(f).replace(" ", "_") for f in fields) + "\n"
        fd = os.open(self._ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    @contextmanager
    def _locked(self) -> Iterator[dict[str, object]]:
        fd = os.open(self._lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                state = json.loads(self._state.read_text())
            except (OSError, ValueError):
                state = {"inside": {}, "max": 0, "over": 0, "double": 0}
            yield state
            tmp = self.dir / f"inside.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(state))
            tmp.rename(self._state)
        finally:
            os.close(fd)  # releases the flock

    def enter(self, key: str) -> int:
        """A body starts (``key`` names it uniquely); returns how many are inside now."""
        with self._locked() as state:
            inside: dict[str, int] = state["inside"]  # type: ignore[assignment]
            for k, pid in list(inside.items()):
                if not _alive(pid):
                    del inside[k]
            task_id = key.split(":")[0]
            if any(k.split(":")[0] == task_id for k in inside):
                state["double"] = int(state.get("double", 0)) + 1  # type: ignore[call-overload]
            inside[key] = os.getpid()
            n = len(inside)
            state["max"] = max(int(state["max"]), n)  # type: ignore[call-overload]
            if n > self.limit:
                state["over"] = int(state["over"]) + 1  # type: ignore[call-overload]
        return n

    def leave(self, key: str) -> None:
        with self._locked() as state:
            inside: dict[str, int] = state["inside"]  # type: ignore[assignment]
            inside.pop(key, None)

    @contextmanager
    def body(self, task_id: str, attempt: int, tag: str = "") -> Iterator[Body]:
        """Around a task body: count it, and write ``start`` then ``end <outcome>``."""
        key = f"{task_id}:{attempt}:{os.getpid()}"
        n = self.enter(key)
        self._append("start", task_id, attempt, os.getpid(), f"{time.time():.6f}", tag, n)
        b = Body()
        try:
            yield b
        except BaseException as exc:
            b.outcome = b.outcome if b.outcome != "ok" else type(exc).__name__
            raise
        finally:
            self.leave(key)
            self._append("end", task_id, attempt, os.getpid(), f"{time.time():.6f}", b.outcome)

    def read(self) -> Counts:
        with self._locked() as state:
            inside: dict[str, int] = state["inside"]  # type: ignore[assignment]
            return Counts(
                inside=sum(1 for pid in inside.values() if _alive(pid)),
                max=int(state["max"]),  # type: ignore[call-overload]
                over=int(state["over"]),  # type: ignore[call-overload]
                double=int(state.get("double", 0)),  # type: ignore[call-overload]
            )

    def ledger(self) -> list[Entry]:
        return read_ledger(self._ledger)


@dataclass(frozen=True)
class Counts:
    inside: int  #: bodies inside now (of live processes)
    max: int  #: the most bodies inside at once
    over: int  #: body starts that made more than ``limit`` inside
    double: int  #: body starts while another body of the same task id was inside


@dataclass
class Body:
    outcome: str = "ok"


@dataclass
class Entry:
    event: str  #: "start" or "end"
    task_id: str
    attempt: int
    pid: int
    at: float
    extra: list[str] = field(default_factory=list)


def read_ledger(path: Path) -> list[Entry]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split(" ")
        if len(parts) < 5:
            continue  # never happens with O_APPEND single writes; tolerate a torn tail anyway
        out.append(
            Entry(parts[0], parts[1], int(parts[2]), int(parts[3]), float(parts[4]), parts[5:])
        )
    return out
