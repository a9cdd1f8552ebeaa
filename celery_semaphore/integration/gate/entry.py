"""What the gate keeps for each limited request it holds (or held): :class:`Entry`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...core import clock
from ...core.semaphore import Semaphore
from .. import config, targets
from ..delivery import Delivery, Stage
from ..locks import Lock
from ..spec import LimitSpec
from ..wait_state import WaitState
from .timing import HELD_PLACE_TTL


@dataclass(eq=False)
class Entry:
    """A limited request the gate holds, or held: its delivery (ticket, claim and stage, see
    :class:`~celery_semaphore.integration.delivery.Stage`) and what the gate needs to act for
    it."""

    req: Any  # celery.worker.request.Request
    spec: LimitSpec
    plan: targets.Plan
    sem: Lock
    opts: config.ResolvedOptions
    delivery: Delivery
    #: where a release wakes it: ``@<the gate's key>``; a single semaphore's waiter takes
    #: handoffs (``@<key>#handoff``, its claim in its owner: see Semaphore(on_handoff=...))
    wake_data: str
    state: WaitState
    owner: dict[str, Any]
    since: float = field(default_factory=clock.monotonic)
    refreshed: float = field(default_factory=clock.monotonic)
    #: counted in the consumer's prefetch window (released when the entry leaves)
    counted: bool = False
    #: a thread is talking to Redis for this entry; others leave it alone
    busy: bool = False
    #: a wake-up came while busy: try again once the current attempt is done
    again: bool = False
    #: when the pool child running its body was first seen gone (0: not seen)
    dead_since: float = 0.0
    #: place in line at the last attempt (0 = head)
    position: int | None = None
    #: seconds the place lives without a refresh
    place_ttl: float = HELD_PLACE_TTL
    #: the grant, once made: (fencing tokens, one per semaphore; lease expiry, server seconds)
    grant: tuple[list[int], float] | None = None
    granted_at: float = 0.0
    #: the hub handed it to the pool (or is doing so in this very call)
    dispatched: bool = False
    #: when a rate window (or a throttle pause) lets it start: tried again then, since no
    #: release wakes it (0: not waiting for time)
    retry_at: float = 0.0
    #: a free pool slot is set aside for it, so it may be granted (see :mod:`..readiness`);
    #: else it keeps its place in line without being granted
    ready: bool = True
    #: since when it has not been ready (monotonic; meaningful while ``ready`` is False)
    unready_since: float = 0.0

    @property
    def group(self) -> tuple[str, str]:
        """Its semaphore and partition: the gate makes tasks ready fairly across these."""
        return (self.sem.name, self.plan.partition)

    @property
    def order(self) -> float:
        """Its place in line, as the semaphore orders it (monotonic seconds): its arrival here,
        moved earlier by ``priority * priority_step``.  A group's line has no priority."""
        if isinstance(self.sem, Semaphore):
            return self.since - self.plan.priority * self.sem.priority_step
        return self.since

    @property
    def ticket(self) -> str:
        return self.delivery.ticket

    @property
    def claim(self) -> str:
        return self.delivery.claim

    @property
    def stage(self) -> Stage:
        return self.delivery.stage
