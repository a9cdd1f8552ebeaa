"""celery-semaphore: fair, crash-safe distributed concurrency limits for Celery, on Redis.

The core primitive, :class:`Semaphore`, does not need Celery.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from .core.exceptions import (
    LeaseLost,
    SemaphoreBackendError,
    SemaphoreError,
    SemaphoreFull,
    SemaphoreRequestError,
    SemaphoreStateError,
    SemaphoreTimeout,
)

if TYPE_CHECKING:
    from .core.group import GroupPermit, SemaphoreGroup
    from .core.rates import Rate
    from .core.semaphore import (
        Attempt,
        AttemptStatus,
        HolderInfo,
        PartitionInfo,
        Permit,
        RateWindowInfo,
        Semaphore,
        Snapshot,
        ThrottleResult,
        WaiterInfo,
    )
    from .integration.body import checkpoint, current_permits
    from .integration.decorators import limited
    from .integration.task import LimitedTask
    from .integration.throttle import throttled

# The core primitive (and redis-py with it) is imported on first use too: every `celery`
# command imports this package, because the `celery semaphore` plugin lives in it.
_CORE = frozenset(
    {
        "Attempt",
        "AttemptStatus",
        "HolderInfo",
        "PartitionInfo",
        "Permit",
        "RateWindowInfo",
        "Semaphore",
        "Snapshot",
        "ThrottleResult",
        "WaiterInfo",
    }
)

# The Celery layer is imported on first use, so the core primitive (and the `celery` CLI
# plugin) never pay for it, and `Semaphore` works without importing Celery.
_CELERY_LAYER = {
    "limited": ("integration.decorators", "limited"),
    "LimitedTask": ("integration.task", "LimitedTask"),
    "checkpoint": ("integration.body", "checkpoint"),
    "current_permits": ("integration.body", "current_permits"),
    "throttled": ("integration.throttle", "throttled"),
}


_GROUP = frozenset({"GroupPermit", "SemaphoreGroup"})


def __getattr__(name: str) -> Any:
    if name in _CORE or name in _GROUP or name == "Rate":
        from importlib import import_module

        module = (
            "core.group" if name in _GROUP else "core.rates" if name == "Rate" else "core.semaphore"
        )
        value = getattr(import_module(f"{__name__}.{module}"), name)
        globals()[name] = value
        return value
    if name in _CELERY_LAYER:
        from importlib import import_module

        from .integration.signals import connect
        from .ops.worker_hooks import install

        connect()
        install()
        module, attr = _CELERY_LAYER[name]
        value = getattr(import_module(f"{__name__}.{module}"), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


try:
    __version__ = version("celery-semaphore")
except PackageNotFoundError:  # pragma: no cover - running from a plain checkout
    __version__ = "0+unknown"

__all__ = [
    # the Celery layer
    "LimitedTask",
    "throttled",
    "checkpoint",
    "current_permits",
    "limited",
    # the core primitive
    "Semaphore",
    "Permit",
    "Rate",
    "SemaphoreGroup",
    "GroupPermit",
    # inspection and the low-level API
    "Attempt",
    "AttemptStatus",
    "HolderInfo",
    "PartitionInfo",
    "RateWindowInfo",
    "Snapshot",
    "ThrottleResult",
    "WaiterInfo",
    # errors
    "LeaseLost",
    "SemaphoreBackendError",
    "SemaphoreError",
    "SemaphoreFull",
    "SemaphoreRequestError",
    "SemaphoreStateError",
    "SemaphoreTimeout",
    "__version__",
]
