"""Standby, below the workers: a release grants a task standing by on its own list, and tells
its gate; the task's wait adopts that grant with no further round trip; the gate's count of
standbys and its rule for sending more (real Redis, no Celery worker)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from celery import Celery

from celery_semaphore.core.semaphore import HANDOFF_MARK, Attempt, AttemptStatus
from celery_semaphore.integration import config, standby, wakes
from celery_semaphore.integration.locks import semaphore_for
from celery_semaphore.ops.testing import RedisServer


@pytest.fixture
def app(redis_server: RedisServer, key_prefix: str) -> Celery:
    app = Celery("standby-paths", set_as_current=False)
    app.conf.update(semaphore_redis_url=redis_server.url(0), semaphore_key_prefix=key_prefix)
    return app


def _standby(app: Celery, key_prefix: str, claim: str) -> tuple[str, str]:
    gate = wakes.gate_key(key_prefix, "node@test", uuid.uuid4().hex)
    return gate, wakes.standby_key(gate, claim)


def _texts(values: list[Any]) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


def test_a_standby_adopts_the_grant_its_gate_forwards_without_a_round_trip(
    app: Celery, key_prefix: str
) -> None:
    sem = semaphore_for(app, "api", 1, 30.0)
    holder = sem.try_acquire("holder:0", claim="h" * 8)
    assert holder.permit is not None
    claim = uuid.uuid4().hex
    gate, key = _standby(app, key_prefix, claim)
    kwargs: dict[str, Any] = {
        "claim": claim,
        "owner": {"task_id": "t", "claim": claim, "lease_ms": 30000},
        "wake_data": wakes.gate_wake_data(key),  # the gate's place, as the gate made it
        "place_ttl": 5.0,
    }
    first = sem.try_acquire("t:0", **kwargs)
    assert first.status is AttemptStatus.WAITING

    assert holder.permit.release()  # the release hands the unit to the gate's list
    client = sem.client
    items = _texts(client.lrange(gate + HANDOFF_MARK, 0, -1))
    assert len(items) == 1
    handoff = wakes.parse(items[0])
    assert isinstance(handoff, wakes.Handoff)
    assert (handoff.ticket, handoff.claim) == ("t:0", claim)
    client.rpush(key, items[0])  # what the gate does for a task standing by

    asked: list[int] = []

    def ask() -> Any:
        asked.append(1)
        return sem.try_acquire("t:0", **kwargs)

    got = standby.wait(sem, "t:0", claim, key, {"api": 1}, first, ask, timeout=5.0)
    assert got.status is AttemptStatus.GRANTED
    assert got.permit is not None
    assert asked == []  # adopted as it came: no round trip
    assert got.permit.fencing_token == handoff.fence
    assert [h.token for h in sem.holders()] == ["t:0"]
    assert got.permit.release()
    assert sem.holders() == []
    assert sem.waiters() == []


def test_a_standby_told_it_was_revoked_stops_waiting(app: Celery, key_prefix: str) -> None:
    sem = semaphore_for(app, "api", 1, 30.0)
    claim = uuid.uuid4().hex
    _, key = _standby(app, key_prefix, claim)
    holder = sem.try_acquire("holder:0")
    assert holder.permit is not None
    first = sem.try_acquire("t:0", claim=claim, wake_data=wakes.gate_wake_data(key), place_ttl=5.0)
    assert first.status is AttemptStatus.WAITING
    sem.client.rpush(key, wakes.cancel_item("t:0", "another claim"))  # not this delivery's
    sem.client.rpush(key, wakes.cancel_item("t:0", claim))
    with pytest.raises(standby.Cancelled):
        standby.wait(sem, "t:0", claim, key, {"api": 1}, first, lambda: first, 5.0)
    assert holder.permit.release()


def _behind_a_holder(
    app: Celery, key_prefix: str
) -> tuple[Any, Any, str, str, dict[str, Any], Attempt]:
    """A semaphore of limit 1 with a holder, and "t:0" waiting behind it as a standby places
    itself: (semaphore, holder's permit, claim, standby list, try_acquire kwargs, first)."""
    sem = semaphore_for(app, "api", 1, 30.0)
    claim = uuid.uuid4().hex
    _, key = _standby(app, key_prefix, claim)
    kwargs: dict[str, Any] = {
        "claim": claim,
        "wake_data": wakes.gate_wake_data(key),
        "place_ttl": 5.0,
    }
    holder = sem.try_acquire("holder:0")
    assert holder.permit is not None
    first = sem.try_acquire("t:0", **kwargs)
    return sem, holder.permit, claim, key, kwargs, first


def test_a_standby_ignores_a_grant_under_another_claim_and_asks_again(
    app: Celery, key_prefix: str
) -> None:
    sem, held, claim, key, kwargs, first = _behind_a_holder(app, key_prefix)
    # a forged grant (another claim), then a plain wake-up once the unit is really free
    sem.client.rpush(key, wakes.handoff_item("t:0", 99, time.time() + 30, "f" * 32))
    timer = threading.Timer(0.2, held.release)
    timer.start()
    try:
        got = standby.wait(
            sem, "t:0", claim, key, {"api": 1}, first, lambda: sem.try_acquire("t:0", **kwargs), 5.0
        )
    finally:
        timer.join()
    assert got.status is AttemptStatus.GRANTED
    assert got.permit is not None
    assert got.permit.fencing_token != 99
    assert got.permit.release()


def test_a_standby_not_granted_in_time_comes_back_waiting_with_its_place(
    app: Celery, key_prefix: str
) -> None:
    sem, held, claim, key, kwargs, first = _behind_a_holder(app, key_prefix)
    got = standby.wait(
        sem, "t:0", claim, key, {"api": 1}, first, lambda: sem.try_acquire("t:0", **kwargs), 0.3
    )
    assert got.status is AttemptStatus.WAITING
    assert [w.ticket for w in sem.waiters()] == ["t:0"]  # the caller parks with it
    assert held.release()


def test_the_gate_sends_standbys_only_while_the_semaphore_turns_over() -> None:
    standing = standby.Standing(2)
    assert standing.wanted("api") == 0  # no grant here yet: nothing to stand by for
    standing.turned_over("api")
    assert standing.wanted("api") == 0  # one grant (and maybe a long hold): not yet
    standing.turned_over("api")
    assert standing.wanted("api") == 2  # two within a second: it turns over
    standing.add("a:0", "api", "c1", wait_timeout=2.0)
    assert standing.wanted("api") == 1
    assert standing.total() == 1
    assert standing.granted("a:0", "another claim") is None  # not its delivery
    assert standing.granted("a:0", "c1") == "api"
    assert standing.wanted("api") == 2
    assert standing.total() == 0
    standing.add("b:0", "api", "c2", wait_timeout=-standby.SLACK)  # already past its time
    assert standing.expire() == ["api"]
    assert standing.total() == 0
    assert standby.Standing(0).wanted("api") == 0


def test_standby_is_on_by_default_for_prefork_only() -> None:
    from celery.concurrency.prefork import TaskPool as Prefork
    from celery.concurrency.solo import TaskPool as Solo
    from celery.concurrency.thread import TaskPool as Threads

    prefork = Prefork.__new__(Prefork)
    assert standby.per_semaphore(None, prefork) == standby.PREFORK_DEFAULT
    assert standby.per_semaphore(None, Threads.__new__(Threads)) == 0
    assert standby.per_semaphore(None, Solo.__new__(Solo)) == 0
    assert standby.per_semaphore(5, Threads.__new__(Threads)) == 5
    assert standby.per_semaphore(0, prefork) == 0


@pytest.mark.parametrize(
    ("value", "error"),
    [(-1, ValueError), ("2", TypeError), (True, TypeError), (1.5, TypeError)],
)
def test_semaphore_worker_standby_is_checked(value: object, error: type[Exception]) -> None:
    check = config.APP_SETTINGS["semaphore_worker_standby"][1]
    with pytest.raises(error, match="semaphore_worker_standby"):
        check("semaphore_worker_standby", value)
    assert check("semaphore_worker_standby", None) is None
    assert check("semaphore_worker_standby", 0) == 0


def test_a_standby_waiter_is_shown_as_standing_by() -> None:
    from celery_semaphore.ops import views

    owner = {"task_id": "t", "host": "w1@h", "standby": "w1@h"}
    assert views.how_waiting(owner, parked=True) == views.STANDBY
    assert views.how_waiting({"task_id": "t"}, parked=True) == views.PARKED
    assert views.how_waiting({"task_id": "t", "held_by": "w1@h"}, parked=True) == views.HELD


def test_a_task_with_a_time_limit_is_not_sent_ahead() -> None:
    from types import SimpleNamespace

    from celery_semaphore.integration.gate.reqs import time_limited

    def req(limits: object, soft: object = None, hard: object = None) -> object:
        task = SimpleNamespace(soft_time_limit=soft, time_limit=hard)
        return SimpleNamespace(time_limits=limits, task=task)

    assert not time_limited(req((None, None)))
    assert time_limited(req((5, None)))  # from the message (apply_async(soft_time_limit=5))
    assert time_limited(req((None, 10)))
    assert time_limited(req((None, None), soft=3))  # the task's own
    assert time_limited(req((None, None), hard=30))
