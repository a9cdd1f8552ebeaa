"""The client-side time seam.

Lease and queue arithmetic happens inside Redis on the server's clock (``TIME``); the client only
needs a monotonic clock for its own deadlines (how long to keep waiting).  Everything in the
package reads time through this module so tests can replace it, as redis-py does with
``import time as mod_time``.
"""

from __future__ import annotations

import time as mod_time


def monotonic() -> float:
    """Seconds from an arbitrary start, never going backwards."""
    return mod_time.monotonic()


def sleep(seconds: float) -> None:
    """Sleep for ``seconds`` (no-op for values <= 0)."""
    if seconds > 0:
        mod_time.sleep(seconds)
