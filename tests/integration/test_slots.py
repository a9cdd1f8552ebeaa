"""Waiting tasks keep permits busy without hogging slots other tasks need (threads pool).

A limited task that must wait stays in its worker slot (woken by the release within
milliseconds) while no other task of that worker wants the slot, and parks (re-published with
a countdown, slot freed) as soon as one does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from celery_semaphore.testing import RedisServer
from tests.conftest import delete_prefix

from . import proj
from .helpers import holders, ran, semaphore
from .workers import Env, Worker, start_worker, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def node(redis_server: RedisServer) -> Iterator[tuple[Env, Worker]]:
    env = Env(redis_url=redis_server.url(0), broker_url=redis_server.url(0), limit=1)
    worker = start_worker(env, pool="threads", concurrency=2)
    try:
        yield env, worker
    finally:
        worker.stop()
        client = redis_server.client(0)
        delete_prefix(client, env.prefix)
        client.delete(env.queue)
        client.close()


def test_waiters_stay_in_idle_slots_and_yield_them_to_other_work(
    node: tuple[Env, Worker],
) -> None:
    env, worker = node
    app = env.client_app()
    blocker = semaphore(env)
    held = blocker.acquire(blocking=False)
    assert held is not None
    sem = semaphore(env)
    try:
        a = app.send_task(proj.work.name, ("a", 0.05))
        wait_until(lambda: len(sem.waiters()) == 1, 20, what="a waits")
        b = app.send_task(proj.work.name, ("b", 0.05))
        wait_until(lambda: len(sem.waiters()) == 2, 20, what="b waits")
        # both slots are taken by waiters, and nothing else wants them: nobody parks, even
        # past wait_timeout (2 s) for b, which is behind the standby window (limit 1)
        observe_until = time.monotonic() + 3.0
        while time.monotonic() < observe_until:
            assert not any(w.parked for w in sem.waiters()), "a waiter parked needlessly"
            time.sleep(0.1)
        # now another task wants a slot: a waiter outside the standby window gives its up
        started = time.monotonic()
        u = app.send_task(proj.unlimited.name, ("u", 0.05))
        assert u.get(timeout=10) == "u"
        assert time.monotonic() - started < 5  # not after a wait of 60 s (IDLE_SLOT_WAIT)
        # a waiter parked to free the slot (it may be back, waiting in its slot, by now)
        assert "parked for" in worker.log(), "nobody parked to free the slot"
        assert ran(env) == []  # the limited bodies still wait for the held permit
    finally:
        held.release()
    assert sorted([a.get(timeout=30), b.get(timeout=30)]) == ["a", "b"]
    wait_until(lambda: not holders(env), 10, what="no holders left")
    assert "parked for" in worker.log()


def test_waiters_give_way_to_a_returning_parked_task(node: tuple[Env, Worker]) -> None:
    """The free unit belongs to a parked task (first in line); its wake-up copy arrives at a
    worker whose two slots are held by later waiters: one of them must park to let it run,
    rather than everyone waiting for IDLE_SLOT_WAIT (60 s)."""
    env, _ = node
    app = env.client_app()
    held = semaphore(env).acquire(blocking=False)
    assert held is not None
    sem = semaphore(env)
    try:
        p = app.send_task(proj.parks_long.name, ("p", 0.05))  # parks at once, countdown 30 s
        wait_until(lambda: any(w.parked for w in sem.waiters()), 20, what="p parked")
        a = app.send_task(proj.work.name, ("a", 0.05))
        b = app.send_task(proj.work.name, ("b", 0.05))
        wait_until(lambda: len(sem.waiters()) == 3, 20, what="a and b wait in their slots")
    finally:
        held.release()  # the unit is p's; the workers' sweep re-dispatches p
    started = time.monotonic()
    assert p.get(timeout=30) == "p"
    assert time.monotonic() - started < 15
    assert sorted([a.get(timeout=30), b.get(timeout=30)]) == ["a", "b"]
    assert ran(env)[0] == "p"  # first in line, first to run
    wait_until(lambda: not holders(env), 10, what="no holders left")
