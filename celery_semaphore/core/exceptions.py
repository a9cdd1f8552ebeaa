"""The exceptions celery-semaphore raises.

Every error the package raises on purpose derives from :class:`SemaphoreError`, and carries the
semaphore's ``name`` (and ``limit`` / ``token`` where they apply) as attributes, so handlers and
log lines can say which limit was involved.  Bad arguments raise the standard ``ValueError`` or
``TypeError`` instead, at construction or decoration time.

This module imports nothing else from the package.
"""

from __future__ import annotations

__all__ = [
    "LeaseLost",
    "SemaphoreBackendError",
    "SemaphoreError",
    "SemaphoreFull",
    "SemaphoreRequestError",
    "SemaphoreStateError",
    "SemaphoreTimeout",
]


class SemaphoreError(Exception):
    """Base class of every error raised by celery-semaphore."""

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        limit: int | None = None,
        token: str | None = None,
    ) -> None:
        super().__init__(message)
        self.name = name
        self.limit = limit
        self.token = token


class SemaphoreTimeout(SemaphoreError, TimeoutError):
    """No permit could be had within the time allowed.

    ``waited`` is how long the caller waited, in seconds.
    """

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        limit: int | None = None,
        token: str | None = None,
        waited: float | None = None,
    ) -> None:
        super().__init__(message, name=name, limit=limit, token=token)
        self.waited = waited


class SemaphoreFull(SemaphoreError):
    """The semaphore's line was full (``max_waiting``), so the caller was not placed in it;
    or, with ``dropped`` True, its place was taken by a newer waiter (``keep_newest``)."""

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        limit: int | None = None,
        token: str | None = None,
        dropped: bool = False,
    ) -> None:
        super().__init__(message, name=name, limit=limit, token=token)
        self.dropped = dropped


class SemaphoreBackendError(SemaphoreError, ConnectionError):
    """Redis could not be reached or failed the command.

    The original redis-py exception is chained as ``__cause__``.  When this is raised during an
    acquire, no permit was granted to the caller (a grant whose reply was lost is found again by
    its token on the next attempt, or expires with its lease).
    """


class SemaphoreRequestError(SemaphoreError, ValueError):
    """What one call of a limited task asks for could not be worked out: a per-call callable
    (name, limit, weight, partition or rate) raised or returned something unusable, or the
    message carried a malformed ``semaphore_wait`` header.  The task fails with this error
    (its message is acknowledged, never redelivered in a loop) and the worker goes on.
    """


class SemaphoreStateError(SemaphoreError):
    """The semaphore's keys in Redis hold something this package did not write.

    Raised, for example, when someone ``SET`` a string where a sorted set belongs.  The scripts
    read every key before their first write, so nothing is modified or deleted; ``key`` names the
    culprit.
    """

    def __init__(self, message: str, *, name: str | None = None, key: str | None = None) -> None:
        super().__init__(message, name=name)
        self.key = key


class LeaseLost(SemaphoreError):
    """The permit's lease expired while the task still ran (its heartbeat could not refresh it
    in time), so another task may hold the unit now.  Raised by
    :func:`celery_semaphore.checkpoint` when the task's ``on_lease_lost`` policy is ``"raise"``.
    """
