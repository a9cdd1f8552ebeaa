"""The worker-side gate: waiting limited tasks wait in the consumer, not in pool slots.

A limited task that cannot get a permit is held by its worker's consumer (unacknowledged, off
the pool) until the release that frees a unit for it wakes the gate, which then hands it to the
pool with its grant.  So waiting tasks never take slots that other work needs, never park while
held, and still run in FIFO order the moment units free up.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from celery_semaphore import Semaphore
from celery_semaphore.core.semaphore import HANDOFF_MARK
from celery_semaphore.integration import wakes
from celery_semaphore.ops import views
from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix

from . import proj
from .helpers import holders, max_inside, ran, semaphore, started
from .workers import Env, Worker, start_worker, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["threads", "prefork", "gevent"])
def node(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[tuple[Env, Worker]]:
    if request.param == "gevent":
        pytest.importorskip("gevent")
    # these tests are about the held tasks: none is sent ahead to stand by in a slot (that
    # has its own tests, in test_standby.py)
    env = Env(
        redis_url=redis_server.url(0),
        broker_url=redis_server.url(0),
        limit=1,
        extra={"semaphore_worker_standby": 0},
    )
    worker = start_worker(env, pool=request.param, concurrency=2)
    try:
        yield env, worker
    finally:
        worker.stop()
        client = redis_server.client(0)
        delete_prefix(client, env.prefix)
        client.delete(env.queue)
        client.close()


def _active(env: Env, worker: Worker) -> list[str]:
    """Task names the worker's pool is running now (Celery's own view, not ours)."""
    app = env.client_app()
    try:
        replies = app.control.inspect(destination=[worker.name], timeout=2).active() or {}
    finally:
        app.close()
    return [t["name"] for t in replies.get(worker.name, [])]


def test_waiting_tasks_are_held_off_the_pool(node: tuple[Env, Worker]) -> None:
    env, worker = node
    app = env.client_app()
    sem = semaphore(env)
    held = sem.acquire(blocking=False)  # the only unit: every limited task must wait
    assert held is not None
    try:
        tags = [f"h{i}" for i in range(6)]
        results = []
        for n, tag in enumerate(tags, 1):  # one at a time: the line's order is the send order
            results.append(app.send_task(proj.work.name, (tag, 0.05)))
            wait_until(lambda n=n: len(sem.waiters()) == n, 20, what=f"{tag} waits")
        # six tasks wait on a worker with two slots: none of them is in the pool ...
        assert not any(name == proj.work.name for name in _active(env, worker))
        # ... so other work runs at once
        began = time.monotonic()
        assert app.send_task(proj.unlimited.name, ("u", 0.05)).get(timeout=20) == "u"
        assert time.monotonic() - began < 5
        assert ran(env) == []  # no limited body ran without the unit
        assert [w.owner.get("host") for w in sem.waiters()] == [worker.name] * len(tags)
        # `show` and `explain` say so, in the docs' words
        hows = {views.how_waiting(w.owner, w.parked) for w in sem.waiters()}
        assert hows == {views.HELD}
        assert {w.owner.get("held_by") for w in sem.waiters()} == {worker.name}
    finally:
        held.release()
    assert [r.get(timeout=30) for r in results] == tags
    assert started(env) == tags  # FIFO: in the order they arrived
    assert max_inside(env) == 1
    wait_until(lambda: not holders(env) and not sem.waiters(), 10, what="nothing left")
    assert "parked in the broker for" not in worker.log()  # held, never re-published


def test_release_hands_the_unit_to_a_held_task_at_once(node: tuple[Env, Worker]) -> None:
    """``parks_long`` would park for 30 s without the gate: held, it runs right after the
    release."""
    env, worker = node
    sem = semaphore(env)
    held = sem.acquire(blocking=False)
    assert held is not None
    result = env.client_app().send_task(proj.parks_long.name, ("p", 0.05))
    try:
        wait_until(lambda: len(sem.waiters()) == 1, 20, what="p waits")
    finally:
        released_at = time.monotonic()
        held.release()
    assert result.get(timeout=20) == "p"
    assert time.monotonic() - released_at < 3
    assert "parked in the broker for" not in worker.log()


def test_revoked_while_held_never_runs_and_leaves_nothing(node: tuple[Env, Worker]) -> None:
    env, _ = node
    app = env.client_app()
    sem = semaphore(env)
    held = sem.acquire(blocking=False)
    assert held is not None
    try:
        victim = app.send_task(proj.work.name, ("victim", 0.05))
        keeper = app.send_task(proj.work.name, ("keeper", 0.05))
        wait_until(lambda: len(sem.waiters()) == 2, 20, what="both wait")
        app.control.revoke(victim.id)
        wait_until(lambda: len(sem.waiters()) == 1, 10, what="the revoked task left the line")
    finally:
        held.release()
    assert keeper.get(timeout=20) == "keeper"
    assert ran(env) == ["keeper"]
    assert victim.state == "REVOKED"
    wait_until(lambda: not holders(env) and not sem.waiters(), 10, what="nothing left")


class _Handoffs:
    """A releaser's side of a handoff, as the Celery layer does it: record each grant and push
    it onto the gate's wake list named by the waiter's wake data (``@<key>``)."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.granted: list[tuple[str, str, int, float]] = []
        self.named: list[tuple[str, str]] = []

    def semaphore(self) -> Semaphore:
        return Semaphore(
            "main",
            self.env.limit,
            redis=self.env.redis_url,
            key_prefix=self.env.prefix,
            lease_ttl=self.env.lease,
            on_wake=lambda ticket, data: self.named.append((ticket, data)),
            on_handoff=self.hand,
        )

    def hand(self, ticket: str, data: str, fence: int, expires_at: float, claim: str) -> None:
        self.granted.append((ticket, data, fence, expires_at))
        push(self.env, data, wakes.handoff_item(ticket, fence, expires_at, claim))


def push(env: Env, data: str, item: str) -> None:
    client = redis.Redis.from_url(env.redis_url)
    try:
        client.rpush(data[1:], item)
    finally:
        client.close()


def test_a_release_hands_the_permit_to_a_held_task(node: tuple[Env, Worker]) -> None:
    """The held task's place takes handoffs: the release grants it the unit in the same
    script, and the gate runs it with that very grant (no attempt of its own)."""
    env, _ = node
    hands = _Handoffs(env)
    sem = hands.semaphore()
    held = sem.acquire(blocking=False)
    assert held is not None
    result = env.client_app().send_task(proj.work.name, ("h", 1.0))
    try:
        wait_until(lambda: len(sem.waiters()) == 1, 20, what="h waits")
    finally:
        held.release()
    # granted by the release itself, not named for a claim
    [(ticket, data, fence, _)] = hands.granted
    assert hands.named == []
    assert ticket == f"{result.id}:0"
    assert data.endswith(HANDOFF_MARK)
    assert fence == held.fencing_token + 1
    # the body runs under that grant
    wait_until(lambda: started(env) == ["h"], 20, what="h starts")
    assert [(h.token, h.fencing_token) for h in sem.holders()] == [(ticket, fence)]
    assert result.get(timeout=20) == "h"
    assert max_inside(env) == 1
    wait_until(lambda: not holders(env) and not sem.waiters(), 10, what="nothing left")
    assert sem.inspect().grants_total == fence  # no other grant was made


def test_a_handoff_for_a_task_the_gate_no_longer_holds_is_given_back(
    node: tuple[Env, Worker],
) -> None:
    env, _ = node
    app = env.client_app()
    hands = _Handoffs(env)
    sem = hands.semaphore()
    # a first handoff tells the gate's wake data (where to push a handoff)
    held = sem.acquire(blocking=False)
    assert held is not None
    first = app.send_task(proj.work.name, ("first", 0.05))
    wait_until(lambda: len(sem.waiters()) == 1, 20, what="first waits")
    held.release()
    assert first.get(timeout=20) == "first"
    wait_until(lambda: not holders(env), 10, what="first released")
    # a held task is revoked and leaves the line ...
    held = sem.acquire(blocking=False)
    assert held is not None
    victim = app.send_task(proj.work.name, ("victim", 0.05))
    wait_until(lambda: len(sem.waiters()) == 1, 20, what="victim waits")
    [waiter] = sem.waiters()
    claim = waiter.owner["claim"]  # the claim of any grant to it
    assert waiter.owner["lease_ms"] == round(env.lease * 1000)  # and its lease
    app.control.revoke(victim.id)
    wait_until(lambda: not sem.waiters(), 10, what="the revoked task left the line")
    held.release()
    # ... as a release granted it the unit (the race, made here on purpose)
    ticket = f"{victim.id}:0"
    grant = sem.try_acquire(ticket, claim=claim, place_ttl=10)
    assert grant.permit is not None
    fence = grant.permit.fencing_token
    # an item under another claim, or an untyped one (a task id can read like anything), is
    # not a handoff the gate acts on; the one with the victim's claim is
    push(env, hands.granted[0][1], wakes.handoff_item(ticket, fence, 0, "not-the-claim"))
    push(env, hands.granted[0][1], f"+{fence} 0 {ticket}")
    push(env, hands.granted[0][1], wakes.handoff_item(ticket, fence, 0, claim))
    # the gate gives it back at once (not after the 60 s lease), and it never runs
    wait_until(lambda: not holders(env), 5, what="the orphan grant given back")
    assert ran(env) == ["first"]
