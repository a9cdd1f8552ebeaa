"""Tasks for the spaced rate test (``test_spaced_rates``): loaded by the workers through
``include`` (``Env(extra={"include": ["tests.integration.proj_spaced"]})``).

Each body counts itself with the independent counter of :class:`tests.integration.proj.Body`
(concurrency), whose ``started`` ledger holds the bodies' own start times (the spacing check).
"""

from __future__ import annotations

import time
from typing import Any

from celery_semaphore import Rate, limited
from tests.integration.proj import LEASE, Body, app

_MOD = "tests.integration.proj_spaced"

#: one start every 0.5 s, cluster-wide
SPACED = Rate(2, 1.0, spaced=True)
#: units for 3 at once: with short bodies the spacing is what holds them back
SPACED_LIMIT = 3


@app.task(bind=True, name=f"{_MOD}.spaced")
@limited("spaced", limit=SPACED_LIMIT, rate="2/s spaced", lease_ttl=LEASE)
def spaced(self: Any, tag: str, seconds: float = 0.05) -> str:
    """3 units, one start every 0.5 s."""
    with Body(tag, "spaced"):
        time.sleep(seconds)
    return tag
