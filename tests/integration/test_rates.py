"""Rates and per-key limits on real workers: two prefork nodes (2 children each... 4), with
the gate and without it (tasks wait in their slot or park in the broker).

The starts are counted by the bodies' own clocks (the ``started`` ledger of
:class:`tests.integration.proj.Body`), independently of the semaphore: no window of the period
may hold more than the rate's count.  A body's clock reads its start a little after the grant
(the hop to the pool), so a grant made just before a window and run late can look as if it
were inside it: windows are checked over ``period - SLACK``.  Celery's own per-worker
``rate_limit`` on two nodes would admit twice the count, far above that slack.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator, Sequence

import pytest

from celery_semaphore import Rate, Semaphore
from celery_semaphore.ops.testing import RedisServer

from . import proj_rates
from .helpers import holders, max_inside, reset_bookkeeping, semaphore, started_at
from .workers import Env, Worker, prefork_pair, wait_until

pytestmark = pytest.mark.timeout(150)

#: how much later than its grant a body may read its own start (see the module's docstring)
SLACK = 0.4


@pytest.fixture(scope="module", params=["gate", "no-gate"])
def nodes(
    request: pytest.FixtureRequest, redis_server: RedisServer
) -> Iterator[tuple[Env, list[Worker]]]:
    with prefork_pair(
        redis_server, "tests.integration.proj_rates", gate=request.param == "gate"
    ) as made:
        yield made


@pytest.fixture
def env(nodes: tuple[Env, list[Worker]]) -> Iterator[Env]:
    env, _ = nodes
    yield env
    reset_bookkeeping(env)


def _run(env: Env, task: object, calls: Sequence[tuple[object, ...]], timeout: float) -> float:
    """Send every call at once; wait for all; the seconds it took."""
    app = env.client_app()
    try:
        began = time.monotonic()
        results = [app.send_task(task.name, call) for call in calls]  # type: ignore[attr-defined]
        for result in results:
            result.get(timeout=timeout)
        return time.monotonic() - began
    finally:
        app.close()


def _most_in_window(times: list[float], period: float) -> int:
    """The most starts in any window of ``period`` seconds."""
    times = sorted(times)
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= period:
            first += 1
        most = max(most, last - first + 1)
    return most


def _no_leak(env: Env, *names: str) -> None:
    for name in names:
        wait_until(lambda n=name: not holders(env, n), 10, what=f"no holders of {name}")
        assert semaphore(env, name).waiters() == []


def test_rate_holds_across_nodes(env: Env) -> None:
    """Short bodies, 8 units, 5 per 1.5 s: the rate is the constraint; no window holds more
    than 5 starts, and each start comes soon after its window opens (the gate and a waiting
    slot wake for it: nobody releases then; a gate checking at its 1 s tick would start them
    up to 0.5 s late, 2 s apart)."""
    calls = [(f"r{i}",) for i in range(25)]
    took = _run(env, proj_rates.rate_bound, calls, timeout=60)
    starts = sorted(started_at(env).values())
    assert len(starts) == 25
    assert _most_in_window(starts, 1.5 - SLACK) <= 5, starts
    # 25 starts, 5 per 1.5 s: the 25th can start 6 s after the first at the earliest
    assert starts[-1] - starts[0] >= 6.0 - SLACK, starts
    assert took >= 6.0 - SLACK
    # each start about one period after the start 5 before it (0.3 s for slow hops; the 1 s
    # tick would make it 2 s)
    gaps = sorted(b - a for a, b in zip(starts, starts[5:], strict=False))
    assert statistics.median(gaps) <= 1.5 + 0.3, gaps
    assert 1 <= max_inside(env, "rate-bound") <= 8
    _no_leak(env, "rate-bound")


def test_fifo_when_the_rate_holds_the_line(env: Env) -> None:
    """The window is used up; 8 tasks join the line one after another; when it opens, the
    first 5 in line start first, then the other 3: the rate keeps the line's order."""
    blocker = Semaphore(
        "rate-bound", 8, redis=env.redis_url, key_prefix=env.prefix, rate=Rate(5, 1.5)
    )
    # an earlier test's starts may still be in the window: wait until it is empty
    wait_until(
        lambda: all(w.started == 0 for w in blocker.inspect().rates), 10, what="an empty window"
    )
    for _ in range(5):  # five starts: the window is full for 1.5 s
        permit = blocker.acquire(blocking=False)
        assert permit is not None
        permit.release()
    line = semaphore(env, "rate-bound")
    app = env.client_app()
    try:
        results = []
        for i in range(8):
            results.append(app.send_task(proj_rates.rate_bound.name, (f"q{i}",)))
            wait_until(
                lambda n=i + 1: len(line.waiters()) + len(started_at(env)) >= n,
                20,
                what=f"q{i} in line",
            )
        for result in results:
            result.get(timeout=30)
    finally:
        app.close()
    order = [tag for tag, _ in sorted(started_at(env).items(), key=lambda item: item[1])]
    assert set(order[:5]) == {f"q{i}" for i in range(5)}, order
    assert set(order[5:]) == {f"q{i}" for i in range(5, 8)}, order
    _no_leak(env, "rate-bound")


def test_limit_and_rate_hold_together(env: Env) -> None:
    """Long bodies, 2 units, 20/s: the units are the constraint, and reached exactly."""
    calls = [(f"l{i}",) for i in range(10)]
    _run(env, proj_rates.limit_bound, calls, timeout=60)
    starts = list(started_at(env).values())
    assert len(starts) == 10
    assert max_inside(env, "limit-bound") == 2
    assert _most_in_window(starts, 1.0 - SLACK) <= 20
    _no_leak(env, "limit-bound")


def test_two_windows_hold_together(env: Env) -> None:
    """4/s and 6/3s: 4 start at once, 2 a second later (the long window is then full), 4
    when the first leave the long window (3 s), the last 2 a second later: 4 s at least."""
    calls = [(f"w{i}",) for i in range(12)]
    _run(env, proj_rates.two_windows, calls, timeout=60)
    starts = sorted(started_at(env).values())
    assert len(starts) == 12
    assert _most_in_window(starts, 1.0 - SLACK) <= 4, starts
    assert _most_in_window(starts, 3.0 - SLACK) <= 6, starts
    assert starts[-1] - starts[0] >= 4.0 - SLACK, starts
    _no_leak(env, "two-windows")


def test_per_key_limits_hold_independently(env: Env) -> None:
    """One semaphore per tenant, each with its key's limit: gold 3 (its own entry), trial-x 1
    (a pattern), others 2 (the default); each reaches its limit and none exceeds it."""
    tenants = {"gold": 3, "trial-x": 1, "acme": 2}
    calls = [(t, f"{t}-{i}") for t in tenants for i in range(6)]
    _run(env, proj_rates.per_tenant, calls, timeout=60)
    for tenant, limit in tenants.items():
        assert max_inside(env, f"tenant-{tenant}") == limit, tenant
    _no_leak(env, *(f"tenant:{t}" for t in tenants))


def test_per_key_rates_hold_independently(env: Env) -> None:
    """A rate from a callable of the arguments: "fast" 6/s, "slow" 2/s, each its own."""
    calls = [(tier, f"{i}") for tier in ("fast", "slow") for i in range(8)]
    _run(env, proj_rates.per_tier_rate, calls, timeout=60)
    times = started_at(env)
    fast = [at for tag, at in times.items() if tag.startswith("fast/")]
    slow = [at for tag, at in times.items() if tag.startswith("slow/")]
    assert len(fast) == len(slow) == 8
    assert _most_in_window(fast, 1.0 - SLACK) <= 6, sorted(fast)
    assert _most_in_window(slow, 1.0 - SLACK) <= 2, sorted(slow)
    # the slow key's rate does not hold the fast one back: 8 starts at 2/s take 3 s
    assert max(slow) - min(slow) >= 3.0 - SLACK
    assert max(fast) - min(fast) < max(slow) - min(slow)
    _no_leak(env, "tier:fast", "tier:slow")
