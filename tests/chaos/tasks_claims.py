"""Tasks for :mod:`tests.chaos.test_claim_partial_failure`, loaded by the workers of
``celery -A tests.chaos.tasks`` through the ``include`` setting (``CS_EXTRA``).

* ``job(tag, seconds)``: limited by ``main`` (limit 1); a task that parks comes back after
  exactly :data:`BACKOFF` seconds (no jitter), so the test knows when its copy returns;
* ``hold_until(tag, marker, timeout)``: limited by ``main``; its body runs until the file
  ``<CS_CHAOS_DIR>/<marker>`` exists (at most ``timeout`` seconds), so the test decides when its
  release happens;
* ``filler(tag)``: limited by ``other`` (limit 1), which the test holds itself: it only takes the
  gate's ``semaphore_worker_hold`` place.  Its body is not counted (another semaphore).

``main``'s bodies run inside the independent counter and ledger of :mod:`tests.chaos.record`.
The tasks are not shared (``shared=False``): the test imports this module for their names, and
they must not join the other apps of the test process.
"""

from __future__ import annotations

import time
from typing import Any

from celery_semaphore import limited

from .tasks import app, rec

__all__ = ["BACKOFF", "LEASE", "filler", "hold_until", "job"]

#: the lease of every task here (a handoff's grant lives this long unless used)
LEASE = 30.0
#: the countdown of a task that parks (its first wait): exact, no jitter
BACKOFF = 8.0


@app.task(bind=True, name="tests.chaos.tasks_claims.job", shared=False)
@limited("main", limit=1, lease_ttl=LEASE, retry_backoff=BACKOFF, retry_jitter=False)
def job(self: Any, tag: str, seconds: float = 0.1) -> str:
    req = self.request
    with rec.body(req.id, req.retries or 0, tag):
        time.sleep(seconds)
    return tag


@app.task(bind=True, name="tests.chaos.tasks_claims.hold_until", shared=False)
@limited("main", limit=1, lease_ttl=LEASE, retry_backoff=BACKOFF, retry_jitter=False)
def hold_until(self: Any, tag: str, marker: str, timeout: float = 30.0) -> str:
    req = self.request
    path = rec.dir / marker
    with rec.body(req.id, req.retries or 0, tag):
        deadline = time.monotonic() + timeout
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return tag


@app.task(bind=True, name="tests.chaos.tasks_claims.filler", shared=False)
@limited("other", limit=1, lease_ttl=LEASE)
def filler(self: Any, tag: str) -> str:
    return tag
