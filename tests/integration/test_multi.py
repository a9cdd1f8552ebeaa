"""Several semaphores per task, on real workers: acquired all or nothing (one script), released
together, never deadlocking, whatever the overlap between tasks."""

from __future__ import annotations

import itertools
import time

import pytest

from . import proj
from .helpers import holders, max_inside, semaphore, started
from .workers import Env, start_workers, stop_workers, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("hold", [pytest.param(1000, id="gate"), pytest.param(0, id="parking")])
def test_overlapping_pairs_never_deadlock(env: Env, hold: int) -> None:
    """Resources 0..4 in a ring, each limit 1; every task needs two neighbours (a cycle: with
    one-at-a-time acquisition this deadlocks).  All complete, no resource ever has two."""
    env.extra = {"semaphore_worker_hold": hold, "semaphore_slot_wait_timeout": 0.0}
    spec = {"pool": "threads", "concurrency": 6}
    nodes = start_workers(env, spec, {**spec, "pool": "prefork", "concurrency": 3})
    app = env.client_app()
    ring = 5
    try:
        pairs = [(i % ring, (i + 1) % ring) for i in range(ring)]
        jobs = [(a, b) if n % 2 else (b, a) for n, (a, b) in enumerate(pairs * 12)]
        results = [
            app.send_task(proj.pair.name, (a, b, f"p{n}", 0.02)) for n, (a, b) in enumerate(jobs)
        ]
        done = [r.get(timeout=90) for r in results]
    finally:
        app.close()
        stop_workers(nodes)
    assert sorted(done) == sorted(f"p{n}" for n in range(len(jobs)))
    for resource in range(ring):
        assert max_inside(env, f"pair-{resource}") == 1, resource  # independent counter
        name = f"pair:{resource}"
        assert holders(env, name) == []
        assert semaphore(env, name, 1).waiters() == []


def test_stacked_limits_hold_together(env: Env) -> None:
    env.limit = 2
    (node,) = start_workers(env, {"pool": "threads", "concurrency": 8})
    app = env.client_app()
    try:
        customers = ["a", "b", "c"]
        results = [
            app.send_task(proj.stacked.name, (c, f"{c}{i}", 0.05))
            for i, c in itertools.product(range(6), customers)
        ]
        assert len([r.get(timeout=60) for r in results]) == 18
    finally:
        app.close()
        stop_workers([node])
    assert max_inside(env, "stack-db") == 2  # the shared limit, reached and held
    for c in customers:
        assert max_inside(env, f"stack-{c}") == 1  # each customer's own
    wait_until(lambda: not holders(env, "stack-db"), 10, what="no holders")


def test_the_heartbeat_keeps_a_group_held(env: Env) -> None:
    """Leases of 2 s, a task holding two semaphores for 6 s: the heartbeat refreshes both
    (the group as one), so a task needing one of them waits until the first releases."""
    env.lease = 2.0
    (node,) = start_workers(env, {"pool": "threads", "concurrency": 4})
    app = env.client_app()
    try:
        long = app.send_task(proj.pair.name, (0, 1, "long", 6.0))
        wait_until(lambda: len(holders(env, "pair:1")) == 1, 20, what="long holds")
        short = app.send_task(proj.pair.name, (1, 2, "short", 0.02))
        time.sleep(4.0)  # two leases: without refreshes both permits would have expired
        assert [h.lease_remaining > 0 for h in holders(env, "pair:0")] == [True]
        assert not short.ready()
        assert long.get(timeout=20) == "long"
        assert short.get(timeout=20) == "short"
    finally:
        app.close()
        stop_workers([node])
    assert max_inside(env, "pair-1") == 1
    assert [t for t in started(env) if not t.endswith("+")] == ["long", "short"]
