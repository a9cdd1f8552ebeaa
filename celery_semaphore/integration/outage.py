"""An outage of Redis as one thread sees it: logged once when it starts, and once, with a
count, when it ends, however often the thread's calls fail in between."""

from __future__ import annotations

import threading
from typing import Any

from ..core import clock

__all__ = ["Outage"]


class Outage:
    """``failed(exc)`` after each failed call, ``ok()`` after each one that worked.

    The first failure is logged at WARNING with ``started`` (a format taking the error's type
    and text); later ones at DEBUG only.  The first success after them logs ``ended`` (a format
    taking the outage's length in seconds and the number of failed calls) at WARNING."""

    def __init__(self, log: Any, started: str, ended: str) -> None:
        self.log = log
        self.started = started
        self.ended = ended
        self.since: float | None = None  #: monotonic time of the first failure, None: no outage
        self.failures = 0  #: failed calls in this outage
        self._lock = threading.Lock()

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            first = self.since is None
            if first:
                self.since = clock.monotonic()
                self.failures = 0
            self.failures += 1
        if first:
            self.log.warning(self.started, type(exc).__name__, exc, semaphore=None, task_id=None)
        else:
            self.log.debug(
                "%s: %s (failure #%d of this outage)",
                type(exc).__name__,
                exc,
                self.failures,
                semaphore=None,
                task_id=None,
            )

    def ok(self) -> None:
        if self.since is None:  # the common case: no lock
            return
        with self._lock:
            since, failures = self.since, self.failures
            self.since = None
        if since is not None:
            length = clock.monotonic() - since
            self.log.warning(self.ended, length, failures, semaphore=None, task_id=None)
