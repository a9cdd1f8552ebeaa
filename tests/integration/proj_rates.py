"""Tasks for the rate and per-key tests (``test_rates``): loaded by the workers through
``include`` (``Env(extra={"include": ["tests.integration.proj_rates"]})``).

Each body counts itself with the independent counter of :class:`tests.integration.proj.Body`
(concurrency), whose ``started`` ledger holds the bodies' own start times (the rate check).
"""

from __future__ import annotations

import time
from typing import Any

from celery_semaphore import Rate, limited, throttled
from tests.integration.proj import LEASE, PREFIX, Body, app, bookkeeping

_MOD = "tests.integration.proj_rates"


@app.task(bind=True, name=f"{_MOD}.rate_bound")
@limited("rate-bound", limit=8, rate=Rate(5, 1.5), lease_ttl=LEASE)
def rate_bound(self: Any, tag: str, seconds: float = 0.02) -> str:
    """8 units, 5 starts per 1.5 s: with short bodies the rate is what holds them back."""
    with Body(tag, "rate-bound"):
        time.sleep(seconds)
    return tag


@app.task(bind=True, name=f"{_MOD}.limit_bound")
@limited("limit-bound", limit=2, rate="20/s", lease_ttl=LEASE)
def limit_bound(self: Any, tag: str, seconds: float = 0.4) -> str:
    """2 units, 20 starts per second: with long bodies the units are what hold them back."""
    with Body(tag, "limit-bound"):
        time.sleep(seconds)
    return tag


@app.task(bind=True, name=f"{_MOD}.two_windows")
@limited("two-windows", limit=8, rate=["4/s", "6/3s"], lease_ttl=LEASE)
def two_windows(self: Any, tag: str, seconds: float = 0.02) -> str:
    """At most 4 starts in any second and 6 in any 3 seconds."""
    with Body(tag, "two-windows"):
        time.sleep(seconds)
    return tag


#: concurrency per tenant: gold by its own entry, the rest by the table's default
TENANT_LIMITS = {"tenant:gold": 3, "tenant:trial-*": 1, "*": 2}


@app.task(bind=True, name=f"{_MOD}.per_tenant")
@limited("tenant:{tenant}", limit=TENANT_LIMITS, lease_ttl=LEASE)
def per_tenant(self: Any, tenant: str, tag: str, seconds: float = 0.3) -> str:
    """One semaphore per tenant, each with the limit its key gives."""
    with Body(tag, f"tenant-{tenant}"):
        time.sleep(seconds)
    return tag


def _tier_rate(arguments: Any) -> str:
    return "6/s" if arguments["tier"] == "fast" else "2/s"


@app.task(bind=True, name=f"{_MOD}.per_tier_rate")
@limited("tier:{tier}", limit=8, rate=_tier_rate, lease_ttl=LEASE)
def per_tier_rate(self: Any, tier: str, tag: str, seconds: float = 0.02) -> str:
    """A rate per key, from a callable of the arguments."""
    with Body(f"{tier}/{tag}", f"tier-{tier}"):
        time.sleep(seconds)
    return tag


# -- a fake downstream service that refuses calls above its capacity (adaptive limits) ------

SERVICE = f"{PREFIX}:svc"


def _call_service(kind: str) -> bool:
    """One call of 0.1 s to the fake service, counted in Redis: refused (False) when more
    than ``<svc>:capacity`` calls are in flight, as a 429 would be."""
    r = bookkeeping()
    capacity = int(r.get(f"{SERVICE}:capacity") or 3)
    inflight = int(r.incr(f"{SERVICE}:inflight:{kind}"))
    try:
        if inflight > capacity:
            r.incr(f"{SERVICE}:refused:{kind}")
            return False
        time.sleep(0.1)
        r.incr(f"{SERVICE}:ok:{kind}")
        return True
    finally:
        r.decr(f"{SERVICE}:inflight:{kind}")


@app.task(bind=True, name=f"{_MOD}.adaptive_call")
@limited("svc-adaptive", limit=10, adaptive=True, lease_ttl=LEASE)
def adaptive_call(self: Any, tag: str) -> bool:
    """Calls the service; on a refusal tells the semaphore (which halves its limit)."""
    ok = _call_service("adaptive")
    if not ok:
        throttled(retry_after=0.2)
    return ok


@app.task(bind=True, name=f"{_MOD}.fixed_call")
@limited("svc-fixed", limit=10, lease_ttl=LEASE)
def fixed_call(self: Any, tag: str) -> bool:
    """The same calls under a fixed limit: nothing backs off."""
    return _call_service("fixed")


@app.task(bind=True, name=f"{_MOD}.rate_only")
@limited("rate-only", limit=50, rate="2/s", lease_ttl=LEASE)
def rate_only(self: Any, tag: str, seconds: float = 0.02) -> str:
    """Far more units than slots, 2 starts per second: only the rate holds them back."""
    with Body(tag, "rate-only"):
        time.sleep(seconds)
    return tag


@app.task(bind=True, name=f"{_MOD}.rated_busy")
@limited("rated-busy", limit=50, rate="2/s", lease_ttl=LEASE)
def rated_busy(self: Any, tag: str, seconds: float = 0.02) -> str:
    """50 units, 2 starts per second: the rate holds them back, also while other work fills
    the pool (a grant is a start: none is made for a task no free slot starts)."""
    with Body(tag, "rated-busy"):
        time.sleep(seconds)
    return tag
