"""The arrivals thread: the first attempt of every request received, in order, and held tasks
made ready as pool slots free (see :mod:`..readiness`).  (Dead pool children are looked for
on a thread of their own: :mod:`.reaper`.)"""

from __future__ import annotations

import threading
from collections import deque

from ... import logs
from .. import readiness
from . import timing
from .entry import Entry
from .ready import Readying

log = logs.get("gate")


class Arrivals:
    """The requests received and not tried yet, oldest first, and the condition the arrivals
    thread waits on (a request came, or a pool slot may be free)."""

    def __init__(self) -> None:
        self.queue: deque[Entry] = deque()
        self.cond = threading.Condition(threading.Lock())

    def push(self, entry: Entry) -> None:
        with self.cond:
            self.queue.append(entry)
            self.cond.notify()

    def notify(self) -> None:
        """A pool slot may be free: the arrivals thread makes held tasks ready for it."""
        with self.cond:
            self.cond.notify()

    def notify_all(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def clear(self) -> None:
        with self.cond:
            self.queue.clear()


class ArrivalsThread:
    """Runs the arrivals thread (see the module's docstring)."""

    def __init__(self, arrivals: Arrivals, readying: Readying, stop: threading.Event) -> None:
        self.arrivals = arrivals
        self.readying = readying
        self.attempts = readying.attempts
        self.registry = readying.registry
        self._stop = stop
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(
            target=self._run, name="celery-semaphore-gate-arrivals", daemon=True
        )
        self.thread.start()

    def _run(self) -> None:
        arrivals = self.arrivals
        while not self._stop.is_set():
            with arrivals.cond:
                if not arrivals.queue:
                    busy = self.registry.not_ready() > 0
                    poll = readiness.READY_POLL if busy else timing.TICK
                    arrivals.cond.wait(poll)
                if self._stop.is_set():
                    return
                entry = arrivals.queue.popleft() if arrivals.queue else None
            if entry is None:
                self._ready_more()
            else:
                self._first_attempt(entry)

    def _first_attempt(self, entry: Entry) -> None:
        try:
            self.attempts.attempt(entry, first=True)
        except Exception as exc:  # never let it die; the tick retries the entry
            with self.registry.lock:
                self.registry.idle(entry)
            log.warning(
                "gate: first attempt failed: %s: %s; retried at the next tick",
                type(exc).__name__,
                exc,
                semaphore=entry.sem.name,
                task_id=entry.req.id,
            )

    def _ready_more(self) -> None:
        try:
            self.readying.ready_more()
        except Exception as exc:  # never let the arrivals thread die; looked at again soon
            log.warning(
                "gate: making held tasks ready failed: %s: %s; carrying on",
                type(exc).__name__,
                exc,
                semaphore=None,
                task_id=None,
            )
