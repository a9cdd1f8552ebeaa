"""A spaced rate on real workers: two prefork nodes (4 children each), with the gate and
without it (tasks wait in their slot or park in the broker).

``rate="2/s spaced"``: one start every 0.5 s across the cluster, where ``"2/s"`` would start
two at once.  The starts are read from the bodies' own clocks (the ``started`` ledger of
:class:`tests.integration.proj.Body`), independently of the semaphore.  The script spaces the
grants on the Redis server's clock to within 1 ms; a body reads its start a little after its
grant (the hop to the pool, which varies from one task to the next), so two bodies' starts may
look closer than the interval by up to that hop's variation: JITTER.  Starts made in bursts
would be 0 s apart, far below ``interval - JITTER``.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterator, Sequence

import pytest

from celery_semaphore import Semaphore
from celery_semaphore.ops.testing import RedisServer

from . import proj_spaced
from .helpers import holders, max_inside, reset_bookkeeping, semaphore, started_at
from .workers import Env, Worker, prefork_pair, wait_until

pytestmark = pytest.mark.timeout(150)

INTERVAL = proj_spaced.SPACED.interval
#: how much closer than the interval two bodies may read their starts (see the docstring):
#: one hop delayed by a busy CI host, the next not.  Bursts are 0 s apart, still far below.
JITTER = 0.4


@pytest.fixture(scope="module", params=["gate", "no-gate"])
def nodes(
    request: pytest.FixtureRequest, redis_server: RedisServer
) -> Iterator[tuple[Env, list[Worker]]]:
    with prefork_pair(
        redis_server, "tests.integration.proj_spaced", gate=request.param == "gate"
    ) as made:
        yield made


@pytest.fixture
def env(nodes: tuple[Env, list[Worker]]) -> Iterator[Env]:
    env, _ = nodes
    yield env
    reset_bookkeeping(env)


def _gaps(starts: Sequence[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(sorted(starts))]


def _no_leak(env: Env) -> None:
    wait_until(lambda: not holders(env, "spaced"), 10, what="no holders of spaced")
    assert semaphore(env, "spaced").waiters() == []


def _wait_for_a_quiet_rate(env: Env) -> Semaphore:
    """A client of the semaphore, once an earlier test's last start no longer holds the next."""
    sem = Semaphore(
        "spaced",
        proj_spaced.SPACED_LIMIT,
        redis=env.redis_url,
        key_prefix=env.prefix,
        rate=proj_spaced.SPACED,
    )
    wait_until(lambda: all(w.opens_in == 0 for w in sem.inspect().rates), 10, what="quiet")
    return sem


def test_spaced_starts_across_nodes(env: Env) -> None:
    """12 tasks sent at once: they start one by one, INTERVAL apart (not two at once), the
    units never exceeded, and nothing left behind."""
    sem = _wait_for_a_quiet_rate(env)
    grants_before = sem.inspect().grants_total
    app = env.client_app()
    try:
        results = [app.send_task(proj_spaced.spaced.name, (f"s{i}",)) for i in range(12)]
        for result in results:
            result.get(timeout=60)
    finally:
        app.close()
    starts = sorted(started_at(env).values())
    assert len(starts) == 12
    gaps = _gaps(starts)
    assert min(gaps) >= INTERVAL - JITTER, gaps
    # evenly: each start comes when it is due, not later (the head retries when the script
    # says the next start is due; nobody releases then).  0.3 s for slow hops; a gate that
    # only noticed at its 1 s tick would space them about 1 s apart
    # (the grants made, when it fails: more than 12 means starts given back unused, each
    # costing an interval, which shows as gaps of whole intervals)
    grants = sem.inspect().grants_total - grants_before
    assert statistics.median(gaps) <= INTERVAL + 0.3, (gaps, f"{grants} grants")
    assert starts[-1] - starts[0] >= 11 * INTERVAL - JITTER, starts
    assert 1 <= max_inside(env, "spaced") <= proj_spaced.SPACED_LIMIT
    _no_leak(env)


def test_spaced_starts_keep_the_line_order(env: Env) -> None:
    """A start has just been made; 6 tasks join the line one after another: they start in
    that order, one per interval (a plain window would start them two at a time)."""
    blocker = _wait_for_a_quiet_rate(env)
    permit = blocker.acquire(blocking=False)  # the next start is due INTERVAL from now
    assert permit is not None
    permit.release()
    line = semaphore(env, "spaced")
    app = env.client_app()
    try:
        results = []
        for i in range(6):
            results.append(app.send_task(proj_spaced.spaced.name, (f"q{i}",)))
            wait_until(
                lambda n=i + 1: len(line.waiters()) + len(started_at(env)) >= n,
                20,
                what=f"q{i} in line",
            )
        for result in results:
            result.get(timeout=30)
    finally:
        app.close()
    times = started_at(env)
    order = [tag for tag, _ in sorted(times.items(), key=lambda item: item[1])]
    assert order == [f"q{i}" for i in range(6)], order
    assert min(_gaps(list(times.values()))) >= INTERVAL - JITTER, sorted(times.values())
    _no_leak(env)
