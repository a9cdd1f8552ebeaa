"""More tasks for the worker app of :mod:`tests.integration.proj`, for the task-id tests
(:mod:`tests.integration.test_claim_ids`).

The workers import this module through the ``include`` setting (``Env(extra={"include":
[__name__]})``): it registers its tasks on :data:`proj.app`, with the same bookkeeping
(:class:`proj.Body`) as the tasks there.

The holders here keep their permit until the test says so: a body waits (bounded) for the
key ``<prefix>:go:<tag>``, so a test can decide when a release happens without sleeping.
"""

from __future__ import annotations

import time
from typing import Any

from celery_semaphore import limited
from tests.integration.proj import LEASE, LIMIT, PREFIX, Body, app, bookkeeping

#: the second semaphore of the group task (limit 1)
SIDE = "ids-side"
#: the longest a holder waits for its go-ahead
HOLD_MAX = 30.0


def go_key(tag: str, prefix: str = PREFIX) -> str:
    """Set this key (to anything) to let the holder ``tag`` finish (``prefix``: the test's
    ``Env.prefix``; the workers' ``PREFIX``)."""
    return f"{prefix}:go:{tag}"


def _wait_for_go(tag: str) -> None:
    deadline = time.monotonic() + HOLD_MAX
    while time.monotonic() < deadline and not bookkeeping().exists(go_key(tag)):
        time.sleep(0.02)


@app.task(bind=True)
@limited("main", limit=LIMIT, lease_ttl=LEASE)
def hold_main(self: Any, tag: str) -> str:
    """Holds a unit of "main" (counted) until told to finish."""
    with Body(tag):
        _wait_for_go(tag)
    return tag


@app.task(bind=True)
@limited(SIDE, limit=1, lease_ttl=LEASE)
def hold_side(self: Any, tag: str) -> str:
    """Holds the unit of :data:`SIDE` (counted) until told to finish."""
    with Body(tag, SIDE):
        _wait_for_go(tag)
    return tag


@app.task(bind=True)
@limited(["main", SIDE], limit={"main": LIMIT, SIDE: 1}, lease_ttl=LEASE)
def main_and_side(self: Any, tag: str, seconds: float = 0.05) -> str:
    """A group-limited task: a unit of "main" and of :data:`SIDE`, all or nothing; counted
    in both."""
    with Body(tag), Body(f"{tag}+", SIDE):
        time.sleep(seconds)
    return tag
