"""What a running task's lost permit says: why it is gone (an operator's release, an expired
lease, another caller's release), at the level it deserves."""

from __future__ import annotations

import time
from typing import Any

from .. import logs
from ..core.semaphore import Semaphore

__all__ = ["log_loss"]

log = logs.get("heartbeat")

#: seconds of clock difference between this host and Redis tolerated when telling an expired
#: lease from an early release
EXPIRY_SLACK = 1.0


def log_loss(permit: Any, task_id: str | None) -> bool:
    """Say why a running task's permit is gone: an operator forced its release (the reason
    they left), or its lease expired and was reclaimed, or another caller released it.  True
    for a forced release."""
    sem = permit.semaphore
    try:
        reason = sem.release_reason(permit.token) if isinstance(sem, Semaphore) else None
    except Exception:  # Redis failing: say what the lease tells
        reason = None
    if reason:
        log.warning(
            "permit RELEASED (token %s): %s; this task keeps running without it, so another "
            "task may now hold this unit",
            permit.token,
            reason,
            semaphore=sem.name,
            task_id=task_id,
        )
        return True
    if permit.lease_expires_at <= time.time() + EXPIRY_SLACK:
        log.error(
            "permit LOST (token %s): its lease expired and was reclaimed, so another task may "
            "now hold this unit",
            permit.token,
            semaphore=sem.name,
            task_id=task_id,
        )
        return False
    log.error(
        "permit LOST (token %s): released by another caller before its lease expired (a "
        "release_token() call or a reset without a reason), so another task may now hold "
        "this unit",
        permit.token,
        semaphore=sem.name,
        task_id=task_id,
    )
    return False
