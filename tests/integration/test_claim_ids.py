"""Task ids are the caller's to choose: whatever id a task has, it must neither get another
task a permit nor keep a later task with the same id from running.

* A ticket (``<task id>:<retries>``) pushed onto a gate's wake list must never be read as a
  handoff record (``+<fence> <expiry ms> <ticket>``): a group-limited task whose id is
  ``+1 2 <victim id>`` must not start the victim on a grant Redis never made.
* A task id reused after the first task finished (``report-user-42``, a common idiom for
  deduplicating concurrent sends) is a new request: it runs, it is not dropped as a duplicate
  of the finished one.
"""

from __future__ import annotations

import uuid
from contextlib import suppress

import pytest
from celery.result import AsyncResult

from . import proj, proj_ids
from .helpers import holders, max_inside, ran, semaphore
from .workers import Env, Worker, start_worker, start_workers, stop_workers, wait_until

pytestmark = pytest.mark.timeout(60)

INCLUDE = {"include": [proj_ids.__name__]}


def _tickets(env: Env, name: str = "main", limit: int = 1) -> list[str]:
    return [w.ticket for w in semaphore(env, name, limit).waiters()]


def _duplicates(*workers: Worker) -> list[str]:
    return [line for w in workers for line in w.log().splitlines() if "duplicate" in line]


def _ready(*results: AsyncResult) -> bool:
    return all(r.ready() for r in results)


@pytest.mark.timeout(45)
def test_a_task_id_shaped_like_a_handoff_grants_nothing(env: Env) -> None:
    """A group-limited task waits with the plain wake address, so a release in a pool child
    pushes its bare ticket onto the gate's wake list.  Its id is ``+1 2 <victim id>``: that
    ticket must wake the attacker, not hand the victim (waiting on the same semaphore, held by
    the same gate) a fence Redis never granted."""
    env.limit = 1
    env.extra = dict(INCLUDE)
    worker = start_worker(env, pool="prefork", concurrency=3)
    app = env.client_app()
    r = env.redis()
    victim_id = f"victim-{uuid.uuid4().hex}"
    attacker_id = f"+1 2 {victim_id}"
    results: list[AsyncResult] = []
    try:
        # "main" (limit 1) and the side semaphore are both taken, by holders in pool children
        long = app.send_task(proj_ids.hold_main.name, ("long",))
        side = app.send_task(proj_ids.hold_side.name, ("side",))
        results += [long, side]
        wait_until(lambda: {"long", "side"} <= set(ran(env)), 20, what="both holders run")
        # the attacker (a group: main + side) waits first, the victim (main alone) behind it;
        # the gate holds both
        attacker = app.send_task(proj_ids.main_and_side.name, ("attacker",), task_id=attacker_id)
        results.append(attacker)
        wait_until(
            lambda: _tickets(env) == [f"{attacker_id}:0"], 20, what="the attacker waits on main"
        )
        victim = app.send_task(proj.work.name, ("victim", 1.0), task_id=victim_id)
        results.append(victim)
        wait_until(
            lambda: _tickets(env) == [f"{attacker_id}:0", f"{victim_id}:0"],
            20,
            what="the victim waits behind the attacker",
        )
        assert sorted(ran(env)) == ["long", "side"]
        # The side unit is released in a pool child: the release wakes the attacker (the head
        # of the side's line) by pushing its ticket, "+1 2 <victim id>:0", onto the gate's
        # wake list.  "main" is still held by "long": nobody may start on it.
        r.set(proj_ids.go_key("side", env.prefix), 1)
        assert side.get(timeout=20) == "side"
        # a bounded look: does the victim start while "long" still holds main?
        with suppress(TimeoutError):
            wait_until(lambda: "victim" in ran(env), 3, what="the victim starts")
        early = list(ran(env))
        inside_then = max_inside(env)
        holders_then = [(h.token, h.fencing_token) for h in holders(env)]
        # now let everything finish
        r.set(proj_ids.go_key("long", env.prefix), 1)
        wait_until(lambda: _ready(*results), 30, what="every task finished")
    finally:
        r.set(proj_ids.go_key("long", env.prefix), 1)
        r.set(proj_ids.go_key("side", env.prefix), 1)
        r.close()
        app.close()
        worker.stop()
    assert inside_then <= 1, (
        f"{inside_then} bodies inside 'main' at once at limit 1: the victim started on a "
        f"grant Redis never made (started: {early}; holders of main then: {holders_then})"
    )
    assert max_inside(env) <= 1
    assert "victim" not in early
    assert long.get(timeout=1) == "long"
    assert victim.get(timeout=1) == "victim"
    assert attacker.get(timeout=1) == "attacker"
    assert sorted(ran(env)) == sorted(["long", "side", "attacker", "attacker+", "victim"])
    assert max_inside(env, proj_ids.SIDE) == 1
    wait_until(
        lambda: not holders(env) and not holders(env, proj_ids.SIDE),
        10,
        what="no holder left on main or the side semaphore",
    )
    wait_until(
        lambda: not _tickets(env) and not _tickets(env, proj_ids.SIDE),
        10,
        what="no waiter left",
    )


def _reused_id_runs_again(env: Env, workers: list[Worker], task_id: str) -> None:
    """Send ``work("second")`` under ``task_id`` (whose first task, ``work("first")``, has
    finished) and check it runs."""
    app = env.client_app()
    try:
        app.send_task(proj.work.name, ("second", 0.05), task_id=task_id)
        # no result to wait for: the backend still holds the first task's under this id
        with suppress(TimeoutError):
            wait_until(lambda: "second" in ran(env), 10, what="the second send runs")
    finally:
        app.close()
    assert ran(env).count("second") == 1, (
        f"the second task with id {task_id!r} never ran (ran: {ran(env)}); worker log: "
        f"{_duplicates(*workers)}"
    )
    assert ran(env).count("first") == 1


@pytest.mark.timeout(45)
def test_a_task_id_reused_after_the_first_finished_runs_again(env: Env) -> None:
    """Nothing waited: the first task ran at once (the short tombstone).  Two nodes: the
    second send may reach the other one (the tombstone is in Redis, shared by both)."""
    env.limit = 1
    env.extra = dict(INCLUDE)
    nodes = start_workers(env, *[{"pool": "prefork", "concurrency": 2}] * 2)
    task_id = f"report-user-42-{uuid.uuid4().hex[:8]}"
    app = env.client_app()
    try:
        first = app.send_task(proj.work.name, ("first", 0.05), task_id=task_id)
        assert first.get(timeout=20) == "first"
        wait_until(lambda: not holders(env), 10, what="the first released")
        _reused_id_runs_again(env, nodes, task_id)
    finally:
        app.close()
        stop_workers(nodes)
    assert max_inside(env) == 1
    wait_until(lambda: not holders(env) and not _tickets(env), 10, what="nothing left")


@pytest.mark.timeout(45)
def test_a_task_id_reused_after_the_first_parked_and_ran_runs_again(env: Env) -> None:
    """The first task had to wait and parked (no gate, no wait in the slot), so it was
    released with the long tombstone (minutes); the same id sent afterwards still runs."""
    env.limit = 1
    env.extra = {**INCLUDE, "semaphore_worker_hold": 0, "semaphore_slot_wait_timeout": 0.0}
    worker = start_worker(env, pool="prefork", concurrency=2)
    task_id = f"report-user-42-{uuid.uuid4().hex[:8]}"
    app = env.client_app()
    r = env.redis()
    try:
        long = app.send_task(proj_ids.hold_main.name, ("long",))
        wait_until(lambda: "long" in ran(env), 20, what="long holds main")
        first = app.send_task(proj.work.name, ("first", 0.05), task_id=task_id)
        wait_until(
            lambda: any(w.ticket == f"{task_id}:0" and w.parked for w in semaphore(env).waiters()),
            20,
            what="the first task parked",
        )
        r.set(proj_ids.go_key("long", env.prefix), 1)  # its release re-dispatches the parked task
        assert long.get(timeout=20) == "long"
        assert first.get(timeout=20) == "first"
        wait_until(lambda: not holders(env), 10, what="the first released")
        _reused_id_runs_again(env, [worker], task_id)
    finally:
        r.set(proj_ids.go_key("long", env.prefix), 1)
        r.close()
        app.close()
        worker.stop()
    assert max_inside(env) == 1
    wait_until(lambda: not holders(env), 10, what="no holder left")
