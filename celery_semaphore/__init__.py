"""celery-semaphore: fair, crash-safe distributed concurrency limits for Celery, on Redis.

The core primitive, :class:`Semaphore`, does not need Celery.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .exceptions import (
    SemaphoreBackendError,
    SemaphoreError,
    SemaphoreStateError,
    SemaphoreTimeout,
)
from .semaphore import (
    Attempt,
    AttemptStatus,
    HolderInfo,
    Permit,
    Semaphore,
    Snapshot,
    WaiterInfo,
)

try:
    __version__ = version("celery-semaphore")
except PackageNotFoundError:  # pragma: no cover - running from a plain checkout
    __version__ = "0+unknown"

__all__ = [
    # the core primitive
    "Semaphore",
    "Permit",
    # inspection and the low-level API
    "Attempt",
    "AttemptStatus",
    "HolderInfo",
    "Snapshot",
    "WaiterInfo",
    # errors
    "SemaphoreBackendError",
    "SemaphoreError",
    "SemaphoreStateError",
    "SemaphoreTimeout",
    "__version__",
]
