"""``try_acquire_many``: several independent attempts in one round trip, each as atomic and
as answered as a lone ``try_acquire``, run in the order given (real Redis)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.backoff import ConstantBackoff
from redis.retry import Retry

from celery_semaphore import AttemptStatus, Semaphore, SemaphoreBackendError
from celery_semaphore.core import _scripts
from celery_semaphore.core.semaphore import Attempt, try_acquire_many

SemaphoreFactory = Callable[..., Semaphore]


def _count_round_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many commands each batch round trip sent (single calls are not counted)."""
    sent: list[int] = []
    real = _scripts._send_and_read_many

    def counting(conn: Any, packed: list[bytes]) -> list[Any]:
        sent.append(len(packed))
        return real(conn, packed)

    monkeypatch.setattr(_scripts, "_send_and_read_many", counting)
    return sent


def test_a_burst_is_one_round_trip_in_order(
    make_semaphore: SemaphoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    api, db = make_semaphore("batch-api", 2), make_semaphore("batch-db", 1)
    sent = _count_round_trips(monkeypatch)
    calls = [(api, f"a{i}:0", {"claim": f"c{i}", "place_ttl": 30.0}) for i in range(5)]
    calls.insert(2, (db, "d0:0", {"claim": "d"}))
    results = try_acquire_many(calls)

    assert sent == [6]
    attempts = [r for r in results if isinstance(r, Attempt)]
    assert len(attempts) == 6
    assert [a.status for a in attempts] == [
        AttemptStatus.GRANTED,
        AttemptStatus.GRANTED,
        AttemptStatus.GRANTED,  # db's
        AttemptStatus.WAITING,
        AttemptStatus.WAITING,
        AttemptStatus.WAITING,
    ]
    assert [a.position for a in attempts[3:]] == [0, 1, 2]  # FIFO: the order given
    assert [w.ticket for w in api.waiters()] == ["a2:0", "a3:0", "a4:0"]
    # each grant is its caller's, under its claim, as from try_acquire
    again = api.try_acquire("a0:0", claim="c0")
    assert again.status is AttemptStatus.ALREADY_HELD
    for attempt in attempts[:3]:
        assert attempt.permit is not None
        assert attempt.permit.release()
    for ticket in ("a2:0", "a3:0", "a4:0"):
        api.withdraw(ticket)


def test_one_bad_call_fails_alone_and_a_flushed_script_is_loaded_again(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    sem = make_semaphore("batch-bad", 2)
    sem.try_acquire("warm:0")  # the scripts are known to the client...
    sem.release_token("warm:0")
    redis_client.script_flush()  # ... not to the server any more: NOSCRIPT, loaded, run again
    sent = _count_round_trips(monkeypatch)
    results = try_acquire_many(
        [
            (sem, "t0:0", {}),
            (sem, "t1:0", {"weight": 3}),
            (sem, "t2:0", {"nonsense": 1}),
            (sem, "t3:0", {}),
        ]
    )
    assert sent == [2]  # the two valid calls, in one round trip
    first, heavy, unknown, last = results
    assert isinstance(heavy, ValueError)
    assert "weight=3" in str(heavy)
    assert isinstance(unknown, TypeError)
    for ok in (first, last):
        assert isinstance(ok, Attempt)
        assert ok.status is AttemptStatus.GRANTED
        assert ok.permit is not None
        assert ok.permit.release()


def test_redis_failing_fails_every_call_of_the_round_trip() -> None:
    client = redis.Redis(port=1, socket_connect_timeout=0.05, retry=Retry(ConstantBackoff(0), 1))
    a, b = Semaphore("down-a", 1, redis=client), Semaphore("down-b", 1, redis=client)
    results = try_acquire_many([(a, "x:0", {}), (b, "y:0", {})])
    assert all(isinstance(r, SemaphoreBackendError) for r in results), results
