"""Tasks for the claim tests (``test_claim_failing_copy``): loaded by the workers through
``include`` (``Env(extra={"include": ["tests.integration.proj_claims"]})``).

All of them take the one unit of the semaphore ``"claims"`` (limit 1) and count their bodies
with the independent counter of :class:`tests.integration.proj.Body` (name ``"claims"``).
"""

from __future__ import annotations

import time
from typing import Any

from celery_semaphore import limited
from tests.integration.proj import LEASE, Body, app

#: the semaphore (and the bookkeeping counter) these tasks share
NAME = "claims"


@app.task(bind=True, name="tests.integration.proj_claims.hold_one")
@limited(NAME, limit=1, lease_ttl=LEASE, max_wait=2.5)
def hold_one(self: Any, tag: str, seconds: float = 0.05) -> str:
    """Holds the unit for ``seconds``; a copy that waits longer than 2.5 s for it fails with
    SemaphoreTimeout."""
    with Body(tag, NAME):
        time.sleep(seconds)
    return tag


@app.task(bind=True, acks_late=True, name="tests.integration.proj_claims.late_one")
@limited(NAME, limit=1, lease_ttl=LEASE, max_wait=4.0)
def late_one(self: Any, tag: str, seconds: float = 0.05) -> str:
    """Like :func:`hold_one`, acknowledged after the body (acks_late), max_wait 4 s: a copy
    the broker redelivers while the body still runs waits, then times out."""
    with Body(tag, NAME):
        time.sleep(seconds)
    return tag


@app.task(bind=True, name="tests.integration.proj_claims.patient_one")
@limited(NAME, limit=1, lease_ttl=LEASE)
def patient_one(self: Any, tag: str, seconds: float = 0.05) -> str:
    """Like :func:`hold_one`, without a max_wait: it waits as long as the unit is taken."""
    with Body(tag, NAME):
        time.sleep(seconds)
    return tag
