"""Tasks for the priority and bounded-line tests (``test_priority_full``): loaded by the
workers through ``include``.  Each body counts itself with :class:`tests.integration.proj.Body`
(its ``started`` ledger gives the order the bodies started in)."""

from __future__ import annotations

import time
from typing import Any

from celery_semaphore import SemaphoreFull, limited
from tests.integration.proj import LEASE, Body, app

_MOD = "tests.integration.proj_prio"


@app.task(bind=True, name=f"{_MOD}.ordered")
@limited("prio-order", limit=1, priority=lambda a: a["prio"], lease_ttl=LEASE)
def ordered(self: Any, tag: str, prio: int, seconds: float = 0.1) -> str:
    """One at a time, ordered by the ``prio`` argument (0-9, higher first)."""
    with Body(tag, "prio-order"):
        time.sleep(seconds)
    return tag


@app.task(bind=True, name=f"{_MOD}.by_message")
@limited("prio-message", limit=1, lease_ttl=LEASE)
def by_message(self: Any, tag: str, seconds: float = 0.1) -> str:
    """One at a time, ordered by the message's ``apply_async(priority=N)``."""
    with Body(tag, "prio-message"):
        time.sleep(seconds)
    return tag


@app.task(bind=True, name=f"{_MOD}.bounded")
@limited("bounded", limit=1, max_waiting=3, on_full="drop", lease_ttl=LEASE)
def bounded(self: Any, tag: str, seconds: float = 0.3) -> str:
    """One at a time, at most 3 waiting; the rest are dropped."""
    with Body(tag, "bounded"):
        time.sleep(seconds)
    return tag


@app.task(bind=True, name=f"{_MOD}.failing")
@limited("failing", limit=1, max_waiting=0, on_full="fail", lease_ttl=LEASE)
def failing(self: Any, tag: str, seconds: float = 0.1) -> str:
    """One at a time, none waiting: a second one fails with SemaphoreFull."""
    with Body(tag, "failing"):
        time.sleep(seconds)
    return tag


@app.task(
    bind=True,
    name=f"{_MOD}.retrying",
    autoretry_for=(SemaphoreFull,),
    retry_backoff=False,
    default_retry_delay=0.3,
    max_retries=30,
)
@limited("retrying", limit=1, max_waiting=0, on_full="fail", lease_ttl=LEASE)
def retrying(self: Any, tag: str, seconds: float = 0.1) -> str:
    """As ``failing``, retried by Celery's ``autoretry_for`` until there is room."""
    with Body(tag, "retrying"):
        time.sleep(seconds)
    return tag


@app.task(bind=True, name=f"{_MOD}.newest")
@limited("newest", limit=1, max_waiting=1, on_full="keep_newest", lease_ttl=LEASE)
def newest(self: Any, tag: str, seconds: float = 0.1) -> str:
    """One at a time, one waiting: a newer task takes the waiting one's place."""
    with Body(tag, "newest"):
        time.sleep(seconds)
    return tag


@app.task(bind=True, name=f"{_MOD}.report")
@limited("report:{user_id}", limit=1, max_waiting=0, on_full="drop", lease_ttl=LEASE)
def report(self: Any, user_id: int, seconds: float = 1.0) -> str:
    """The recipe: at most one run of a user's report at a time; duplicates dropped."""
    with Body(f"report-{user_id}", f"report-{user_id}"):
        time.sleep(seconds)
    return f"report-{user_id}"


@app.task(bind=True, name=f"{_MOD}.fair_prio_work")
@limited("fair-prio", limit=4, priority=lambda a: a["prio"], lease_ttl=LEASE)
def fair_prio_work(self: Any, tag: str, seconds: float = 0.02, prio: int = 0) -> str:
    """As ``proj.fair_work`` (partitioned by delivery queue), with a priority per call: the
    fairness benchmark's third run (benchmarks/fairness.py)."""
    from tests.integration.proj import _fair_body

    return _fair_body(self, tag, seconds, "fair-prio")
