"""Standby: the gate sends the first of its held tasks ahead into free pool slots, where the
release that frees their units grants them directly (``semaphore_worker_standby``).

Real workers on a real Redis: the place in line stays the execution's, so standby changes where
a grant goes, never who gets it (FIFO, the limit), and it never takes the pool's last free slot.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterator
from typing import Any

import pytest

from celery_semaphore.ops import views
from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix

from . import proj
from .helpers import finished_at, holders, ledger, max_inside, semaphore, started, started_at
from .workers import Env, Worker, start_worker, start_workers, wait_until

pytestmark = pytest.mark.timeout(120)


def _env(redis_server: RedisServer, **extra: object) -> Env:
    return Env(
        redis_url=redis_server.url(0),
        broker_url=redis_server.url(0),
        limit=1,
        extra={"semaphore_worker_standby": 2, **extra},
    )


@pytest.fixture
def cleanup(redis_server: RedisServer) -> Iterator[list[tuple[Env, list[Worker]]]]:
    made: list[tuple[Env, list[Worker]]] = []
    yield made
    for env, workers in made:
        for worker in workers:
            worker.stop()
        client = redis_server.client(0)
        delete_prefix(client, env.prefix)
        client.delete(env.queue)
        client.close()


def _hows(env: Env) -> dict[str, str]:
    return dict(item.split(":", 1) for item in ledger(env, "how"))


def _standing(env: Env, worker: Worker) -> int:
    """Tasks standing by: limited tasks the pool runs (Celery's own view) that hold no unit."""
    app = env.client_app()
    try:
        replies = app.control.inspect(destination=[worker.name], timeout=1).active() or {}
    finally:
        app.close()
    in_pool = sum(t["name"] == proj.work_how.name for t in replies.get(worker.name, []))
    return int(in_pool) - len(semaphore(env).holders())


def _turn_over(env: Env) -> None:
    """Two quick grants on the worker: the semaphore turns over, so the next ones the gate
    holds may stand by (none does after a single grant and a long hold)."""
    app = env.client_app()
    try:
        for tag in ("q0", "q1"):
            app.send_task(proj.work_how.name, (tag, 0.01))
    finally:
        app.close()


def _shown_standing(env: Env) -> int:
    """Waiters `show` lists as standing by (once their first poll refreshed their place)."""
    sem = semaphore(env)
    return sum(views.how_waiting(w.owner, w.parked) == views.STANDBY for w in sem.waiters())


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_standby_tasks_run_in_line_order_within_the_limit(
    pool: str, redis_server: RedisServer, cleanup: list[tuple[Env, list[Worker]]]
) -> None:
    env = _env(redis_server)
    worker = start_worker(env, pool=pool, concurrency=5)
    cleanup.append((env, [worker]))
    app = env.client_app()
    sem = semaphore(env)
    tags = [f"t{i}" for i in range(10)]
    # sent at once, through one consumer: their places in line are in the send order
    results = [app.send_task(proj.work_how.name, (tag, 0.3)) for tag in tags]
    wait_until(lambda: len(sem.waiters()) >= 5, 20, what="a line")
    seen: list[int] = []
    for _ in range(3):  # a grant every 0.3 s: the semaphore turns over
        seen.append(_standing(env, worker))
    assert [r.get(timeout=60) for r in results] == tags
    assert started(env) == tags  # FIFO, whatever path each grant took
    assert max_inside(env) == 1  # never above the limit
    hows = _hows(env)
    stood = [t for t in tags if hows[t] == "standby"]
    assert len(stood) >= 3, (hows, seen)  # the gate kept sending the next ones ahead
    assert max(seen) <= 2  # semaphore_worker_standby: 2, while the others are held
    # the gate forwards each grant to its standby at once (not found by the 1 s poll)
    begun, ended = started_at(env), finished_at(env)
    gaps = [begun[b] - ended[a] for a, b in itertools.pairwise(tags) if b in stood]
    assert statistics.median(gaps) < 0.5, gaps
    wait_until(lambda: not sem.holders() and not sem.waiters(), 10, what="nothing left")
    assert holders(env) == []


def test_standby_is_shown_standing_by_once_it_polls(
    redis_server: RedisServer, cleanup: list[tuple[Env, list[Worker]]]
) -> None:
    env = _env(redis_server, semaphore_wait_timeout=10.0)
    worker = start_worker(env, pool="prefork", concurrency=4)
    cleanup.append((env, [worker]))
    app = env.client_app()
    results = [app.send_task(proj.work_how.name, (f"s{i}", 0.05)) for i in range(2)]
    last = app.send_task(proj.work_how.name, ("long", 4.0))  # two grants, then a long hold
    waiting = app.send_task(proj.work_how.name, ("next", 0.05))
    wait_until(lambda: _standing(env, worker) == 1, 20, what="the next one stands by")
    # `show`: held by the worker until its first poll (within a second), standing by since
    wait_until(lambda: _shown_standing(env) == 1, 5, what="shown standing by")
    assert [r.get(timeout=30) for r in (*results, last, waiting)] == ["s0", "s1", "long", "next"]
    assert _hows(env)["next"] == "standby"


def _node_turning_over(
    redis_server: RedisServer,
    cleanup: list[tuple[Env, list[Worker]]],
    concurrency: int,
    **extra: object,
) -> tuple[Env, Worker, Any, Any]:
    """One prefork node whose semaphore has just turned over (so it sends standbys ahead):
    (env, worker, client app, semaphore)."""
    env = _env(redis_server, **extra)
    worker = start_worker(env, pool="prefork", concurrency=concurrency)
    cleanup.append((env, [worker]))
    sem = semaphore(env)
    _turn_over(env)
    return env, worker, env.client_app(), sem


def test_standby_leaves_a_free_slot_for_other_work(
    redis_server: RedisServer, cleanup: list[tuple[Env, list[Worker]]]
) -> None:
    # f0's body is long enough to see what happens beside it (f1 stands by all along: it
    # parks only after semaphore_wait_timeout); the others are short
    env, worker, app, sem = _node_turning_over(
        redis_server, cleanup, concurrency=3, semaphore_wait_timeout=10.0
    )
    flood = [app.send_task(proj.work_how.name, (f"f{i}", 4.0 if i == 0 else 0.3)) for i in range(4)]
    # one body runs, one task stands by in a second slot: the third slot stays free
    wait_until(lambda: len(sem.holders()) == 1 and len(sem.waiters()) == 3, 20, what="a line")
    wait_until(lambda: _standing(env, worker) == 1, 20, what="a standby")
    assert "f0" not in finished_at(env), "f0 ended before the test could look beside it"
    assert app.send_task(proj.unlimited.name, ("u0", 0.05)).get(timeout=30) == "u0"
    began = float(ledger(env, "unlimited_started")[0].split(":")[1])
    assert _standing(env, worker) <= 1
    assert [r.get(timeout=60) for r in flood] == [f"f{i}" for i in range(4)]
    # in the free slot beside f0, not after f0 gave its slot back (an order, not a latency)
    assert began < finished_at(env)["f0"], (began, finished_at(env))
    assert _hows(env)["f1"] == "standby"
    assert max_inside(env) == 1


def test_standby_across_nodes_keeps_the_limit_and_runs_each_task_once(
    redis_server: RedisServer, cleanup: list[tuple[Env, list[Worker]]]
) -> None:
    env = _env(redis_server)
    env = Env(redis_url=env.redis_url, broker_url=env.broker_url, limit=2, extra=env.extra)
    workers = start_workers(
        env,
        {"pool": "prefork", "concurrency": 4},
        {"pool": "prefork", "concurrency": 4},
    )
    cleanup.append((env, workers))
    app = env.client_app()
    tags = [f"x{i}" for i in range(30)]
    results = [app.send_task(proj.work_how.name, (tag, 0.05)) for tag in tags]
    assert sorted(r.get(timeout=90) for r in results) == sorted(tags)
    assert sorted(started(env)) == sorted(tags)  # each body ran once
    assert max_inside(env) == 2
    hows = _hows(env)
    assert "standby" in hows.values(), hows
    sem = semaphore(env, limit=2)
    wait_until(lambda: not sem.holders() and not sem.waiters(), 10, what="nothing left")


def test_a_task_revoked_while_it_stands_by_never_runs_and_leaves_the_line(
    redis_server: RedisServer, cleanup: list[tuple[Env, list[Worker]]]
) -> None:
    env, worker, app, sem = _node_turning_over(redis_server, cleanup, concurrency=4)
    first = app.send_task(proj.work_how.name, ("t0", 1.5))
    wait_until(lambda: len(sem.holders()) == 1, 20, what="t0 runs")
    victim = app.send_task(proj.work_how.name, ("victim", 0.05))
    wait_until(lambda: _standing(env, worker) == 1, 20, what="the victim stands by")
    app.control.revoke(victim.id)
    wait_until(lambda: not sem.waiters(), 10, what="the victim left the line")
    assert first.get(timeout=30) == "t0"
    after = app.send_task(proj.work_how.name, ("after", 0.05))
    assert after.get(timeout=30) == "after"
    assert started(env) == ["q0", "q1", "t0", "after"]  # the victim never ran
    wait_until(lambda: victim.state == "REVOKED", 10, what="the victim is REVOKED")
    wait_until(lambda: not sem.holders() and not sem.waiters(), 10, what="nothing left")


def test_a_standby_that_gives_up_leaves_the_line_at_once(
    redis_server: RedisServer, cleanup: list[tuple[Env, list[Worker]]]
) -> None:
    """A task that stands by and is not granted within semaphore_slot_wait_timeout parks
    without a place: the copy it re-publishes (here with a 10 s countdown) takes a new place
    when it comes back.  Before, the place stayed in line for that copy, and under a deep
    backlog (both nodes' gates full, the copy behind thousands of messages) the units sat
    idle in front of it until the place expired, about a lease later."""
    env, worker, app, sem = _node_turning_over(
        redis_server,
        cleanup,
        concurrency=4,
        semaphore_slot_wait_timeout=0.5,
        semaphore_retry_backoff=10.0,
        semaphore_retry_backoff_max=10.0,
        semaphore_retry_jitter=False,
    )
    first = app.send_task(proj.work_how.name, ("t0", 4.0))
    wait_until(lambda: len(sem.holders()) == 1, 20, what="t0 runs")
    gives_up = app.send_task(proj.work_how.name, ("gives-up", 0.05))
    ticket = f"{gives_up.id}:0"
    wait_until(lambda: _standing(env, worker) == 1, 20, what="it stands by")
    wait_until(lambda: _standing(env, worker) == 0, 10, what="it gave up")
    # parked, its copy counting down in the broker: no place of its is left in line
    assert ticket not in [w.ticket for w in sem.waiters()]
    behind = app.send_task(proj.work_how.name, ("behind", 0.05))
    assert first.get(timeout=30) == "t0"
    assert behind.get(timeout=10) == "behind"  # the next unit went to the task behind it
    assert gives_up.get(timeout=30) == "gives-up"  # its copy came back and ran
    assert max_inside(env) == 1
    wait_until(lambda: not sem.holders() and not sem.waiters(), 10, what="nothing left")
