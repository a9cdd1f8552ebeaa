"""Tasks for the rate and per-key tests (``test_rates``): loaded by the workers through
``include`` (``Env(extra={"include": ["tests.integration.proj_rates"]})``).

Each body counts itself with the independent counter of :class:`tests.integration.proj.Body`
(concurrency), whose ``started`` ledger holds the bodies' own start times (the rate check).
"""

from __future__ import annotations

import time
from typing import Any

from celery_semaphore import Rate, limited
from tests.integration.proj import LEASE, Body, app

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
