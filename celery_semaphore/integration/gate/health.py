"""Redis as the gate sees it: whether it answers, so that a tick while it fails makes no
Redis calls (each would wait out its retries, and the tick's local decisions with them)."""

from __future__ import annotations

from redis.exceptions import RedisError

from ... import logs
from ...core import clock
from ..outage import Outage

log = logs.get("gate")


class Health:
    """When a Redis call of the gate last failed, and when its last tick ended: Redis is
    taken to answer again once a tick has ended since the last failure."""

    def __init__(self) -> None:
        #: when a Redis call last failed, and when the last tick ended (see :meth:`ok`)
        self.failed_at = float("-inf")
        self.tick_ended = 0.0
        #: the held task whose Redis call failed in the last tick that made any
        self.failed_on: str | None = None
        #: Redis failing for the gate thread: logged when it starts and, counted, when it ends
        self.outage = Outage(
            log,
            "gate: Redis is failing (%s: %s); held tasks stay held, keeping their place, and "
            "none runs without a permit; logged again when it answers",
            "gate: Redis answers again after %.1fs (%d failed call(s) meanwhile); held tasks "
            "carry on",
        )

    def failed(self) -> None:
        """A Redis call failed just now."""
        self.failed_at = clock.monotonic()

    def ok(self) -> bool:
        return self.failed_at < self.tick_ended

    def carry_on(self, exc: Exception) -> None:
        self.failed()
        if isinstance(exc, RedisError):  # once per outage, counted when it ends
            self.outage.failed(exc)
        else:  # a bug: every time
            log.warning(
                "gate: %s: %s; carrying on", type(exc).__name__, exc, semaphore=None, task_id=None
            )
