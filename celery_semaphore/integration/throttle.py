"""``throttled()``: the body of a limited task tells its semaphores that the downstream
service refused a call (HTTP 429 or 503), so that every worker backs off::

    @app.task(bind=True, autoretry_for=(RateLimited,), retry_backoff=True)
    @limited("openai", limit=20, adaptive=True)
    def complete(self, prompt):
        response = client.post(...)
        if response.status_code in (429, 503):
            throttled(retry_after=float(response.headers.get("Retry-After", 1)))
            raise RateLimited()
        ...

Each semaphore the running task holds is told through its own permit (the grant's fencing
token goes with the call, so a refusal of a call granted before the last decrease lowers
nothing more): ``retry_after`` pauses every new start for that long, and with
``@limited(..., adaptive=True)`` the limit is halved, then raised again as calls succeed
(see "Adaptive limits" in docs/concepts.md).
"""

from __future__ import annotations

from ..core.group import GroupPermit
from ..core.semaphore import ThrottleResult
from . import config
from .body import current_permits

__all__ = ["throttled"]


def throttled(retry_after: float | None = None) -> list[ThrottleResult]:
    """Report a refusal of the downstream service to every semaphore the running task holds;
    one :class:`~celery_semaphore.ThrottleResult` per semaphore (none in a
    task of an app with ``semaphore_enabled=False``).  Raises RuntimeError outside the body
    of a limited task (use ``Semaphore.throttled()`` there)."""
    permits = current_permits()
    if not permits and _disabled():
        return []  # semaphore_enabled=False (a user's unit tests): nothing to tell
    if not permits:
        raise RuntimeError(
            "throttled() was called outside the body of a limited task (no permit is held in "
            "this thread); call it from a task made with @limited or LimitedTask, or call "
            "Semaphore.throttled() on the semaphore itself"
        )
    results: list[ThrottleResult] = []
    for permit in permits:
        members = permit.permits if isinstance(permit, GroupPermit) else [permit]
        results.extend(member.throttled(retry_after) for member in members)
    return results


def _disabled() -> bool:
    """Is a task running in this thread whose app has the semaphore turned off?"""
    from celery._state import get_current_task

    task = get_current_task()
    return task is not None and not config.setting(task.app.conf, "semaphore_enabled", True)
