"""A logging handler that collects records, so a test can wait for one (on a condition, never
a sleep); used by the tests of the logs and of the heartbeat."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

Match = Callable[[logging.LogRecord], bool]


def containing(text: str) -> Match:
    """Matches a record whose message contains ``text``."""
    return lambda record: text in record.getMessage()


class LogRecords(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self.changed:
            self.records.append(record)
            self.changed.notify_all()

    def count(self, match: Match) -> int:
        with self.changed:
            return sum(1 for r in self.records if match(r))

    def wait_count(self, match: Match, n: int, timeout: float) -> bool:
        """True once ``n`` records match, False if ``timeout`` seconds pass first."""
        with self.changed:
            return self.changed.wait_for(
                lambda: sum(1 for r in self.records if match(r)) >= n, timeout
            )

    def wait_for(self, what: str, match: Match, timeout: float = 20.0) -> logging.LogRecord:
        """The first record that matches, waiting up to ``timeout`` seconds for it."""
        with self.changed:
            found = self.changed.wait_for(
                lambda: next((r for r in self.records if match(r)), None), timeout
            )
        assert found is not None, (
            f"no log record: {what}; got {[r.getMessage() for r in self.records]}"
        )
        return found
