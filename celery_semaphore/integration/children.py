"""Waiting for a prefork pool child to be gone before its permit is given back.

On a hard time limit, billiard runs the task's failure handlers (Celery's ``task_failure``)
*before* it terminates the child, and ``revoke(terminate=True)`` announces the revoke as it
sends the signal: in both cases the body may still be running for a few milliseconds.
Releasing at once would let the next task start beside it, over the limit.  So the parent
waits until the child is gone (a zombie counts as gone), then releases.

Linux only (``/proc``): elsewhere the pids are unknown and the release happens at once, as
before.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from ..core import clock

__all__ = ["EXIT_WAIT", "after_exit", "alive", "pool_children"]

#: how long to wait for the child to die; billiard sends SIGKILL 0.1 s after SIGTERM
EXIT_WAIT = 5.0
_POLL = 0.005


def alive(pid: int) -> bool:
    """Does process ``pid`` exist and not yet exit (a zombie has exited)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    # the state follows the command name, which is in parentheses and may contain spaces
    return stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] not in ("Z", "X", "")


def pool_children() -> set[int]:
    """The live child processes of this process (empty when ``/proc`` cannot tell)."""
    pids: set[int] = set()
    try:
        tasks = list(Path(f"/proc/{os.getpid()}/task").iterdir())
    except OSError:
        return pids
    for task in tasks:
        try:
            pids.update(int(p) for p in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return {pid for pid in pids if alive(pid)}


def after_exit(pids: set[int], action: Callable[[], None], on_timeout: Callable[[], None]) -> None:
    """Run ``action`` in a daemon thread once any of ``pids`` has exited (at once when
    ``pids`` is empty or one is already gone); ``on_timeout`` instead if none has after
    :data:`EXIT_WAIT` seconds (the body may still run: its permit is left to its lease)."""
    if not pids or not all(alive(pid) for pid in pids):
        action()
        return

    def wait() -> None:
        deadline = clock.monotonic() + EXIT_WAIT
        while all(alive(pid) for pid in pids):
            if clock.monotonic() >= deadline:
                on_timeout()
                return
            threading.Event().wait(_POLL)
        action()

    threading.Thread(target=wait, name="celery-semaphore-reap", daemon=True).start()
