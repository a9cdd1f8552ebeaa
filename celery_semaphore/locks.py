"""The lock one call of a limited task takes: one :class:`~celery_semaphore.Semaphore`, or for
a task that takes several at once, a :class:`GroupLock` (all or nothing, one script each time).

The Celery layer talks to both the same way: ``try_acquire``, ``wait``, ``acquire``,
``withdraw``, ``release_token``, ``refresh_token``, with the keyword arguments of
:func:`lock_kwargs`; a group reads as one semaphore in logs (``name`` joins the members').
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .group import GroupPermit, SemaphoreGroup
from .semaphore import HolderInfo, Permit, Semaphore
from .targets import Plan

__all__ = ["GroupLock", "Lock", "adopt", "grant_of", "lock_kwargs", "member_permits"]


class GroupLock(SemaphoreGroup):
    """A :class:`~celery_semaphore.SemaphoreGroup` with the few attributes of a semaphore the
    Celery layer logs and inspects."""

    @property
    def name(self) -> str:
        return "+".join(self.names)

    @property
    def limit(self) -> int:
        return min(sem.limit for sem, _ in self.members)

    def holders(self) -> list[HolderInfo]:
        """Every member's holders (a group grant appears once per member)."""
        return [h for sem, _ in self.members for h in sem.holders()]


Lock = Semaphore | GroupLock


def lock_kwargs(plan: Plan) -> dict[str, Any]:
    """The weight and partition arguments of the lock's try_acquire/wait/acquire."""
    if len(plan.targets) == 1:
        target = plan.targets[0]
        return {"weight": target.weight, **plan.fair(target)}
    return {
        "partition": plan.partition,
        "partition_caps": {t.name: t.partition_cap for t in plan.targets},
        "partition_weight": plan.partition_weight,
    }


def grant_of(permit: Permit) -> list[int]:
    """The fencing tokens of a grant (one per member of a group), for :func:`adopt`."""
    return [p.fencing_token for p in member_permits(permit)]


def member_permits(permit: Permit) -> Sequence[Permit]:
    return permit.permits if isinstance(permit, GroupPermit) else (permit,)


def adopt(
    lock: Lock,
    ticket: str,
    weights: Mapping[str, int],
    fencing: Sequence[int],
    expiry: float,
    claim: str,
) -> Permit:
    """The permit object for a grant made elsewhere (by the worker's gate, in another
    process): ``fencing`` as :func:`grant_of` gave it."""
    if isinstance(lock, GroupLock):
        permits = [
            Permit(sem, ticket, weight, fence, expiry, claim)
            for (sem, weight), fence in zip(lock.members, fencing, strict=True)
        ]
        return GroupPermit(lock, ticket, permits, expiry, claim)
    return Permit(lock, ticket, weights[lock.name], fencing[0], expiry, claim)
