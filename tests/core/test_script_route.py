"""The scripts' lean route (``_scripts.ScriptSet``): which clients take it, and that it behaves
as redis-py's own route does (replies, decoding, NOSCRIPT, connection errors and retries)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_semaphore import Semaphore
from celery_semaphore.core import _scripts
from celery_semaphore.core.exceptions import SemaphoreBackendError
from celery_semaphore.core.semaphore import AttemptStatus


def _cycle(sem: Semaphore) -> None:
    permit = sem.acquire(blocking=False)
    assert permit is not None
    assert permit.fencing_token >= 1
    assert sem.inspect().used == 1
    assert permit.release() is True
    assert sem.release_token(permit.token) is True  # the tombstone answers a re-sent release
    assert sem.inspect().used == 0


def test_a_plain_client_takes_the_lean_route(redis_url: str, key_prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        sem = Semaphore("lean", 2, redis=client, key_prefix=key_prefix)
        _cycle(sem)
        assert sem._scripts is not None
        assert sem._scripts._pool is client.connection_pool
    finally:
        client.close()


def test_decoded_replies_on_the_lean_route(redis_url: str, key_prefix: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        sem = Semaphore("lean-decoded", 2, redis=client, key_prefix=key_prefix)
        _cycle(sem)
        holder = sem.acquire(owner={"who": "ü"})
        assert holder is not None
        assert sem.holders()[0].owner == {"who": "ü"}
        holder.release()
    finally:
        client.close()


@pytest.mark.parametrize("kind", ["single_connection", "instance_wrapped", "class_wrapped"])
def test_other_clients_keep_redis_pys_route(redis_url: str, key_prefix: str, kind: str) -> None:
    calls: list[Any] = []
    if kind == "single_connection":
        client = redis.Redis.from_url(redis_url, single_connection_client=True)
    elif kind == "instance_wrapped":
        client = redis.Redis.from_url(redis_url)
        original = client.execute_command

        def traced(*args: Any, **options: Any) -> Any:
            calls.append(args[0])
            return original(*args, **options)  # type: ignore[no-untyped-call]

        client.execute_command = traced  # type: ignore[method-assign]
    else:

        class Traced(redis.Redis):
            def execute_command(self, *args: Any, **options: Any) -> Any:
                calls.append(args[0])
                return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]

        client = Traced.from_url(redis_url)
    try:
        sem = Semaphore(f"route-{kind}", 2, redis=client, key_prefix=key_prefix)
        _cycle(sem)
        assert sem._scripts is not None
        assert sem._scripts._pool is None
        if kind != "single_connection":
            assert "EVALSHA" in calls  # the instrumentation saw the scripts
    finally:
        client.close()


def test_noscript_on_the_lean_route_loads_the_script(redis_url: str, key_prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        sem = Semaphore("lean-noscript", 1, redis=client, key_prefix=key_prefix)
        _cycle(sem)
        client.script_flush()
        _cycle(sem)
    finally:
        client.close()


def _failing_once(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The lean route's first send fails as a reset connection would (inside the retry)."""
    failed: list[str] = []
    send_and_read = _scripts._send_and_read

    def flaky(conn: Any, packed: bytes) -> Any:
        if not failed:
            failed.append("acquire")
            conn.disconnect()
            raise redis.ConnectionError("connection reset (test)")
        return send_and_read(conn, packed)

    monkeypatch.setattr(_scripts, "_send_and_read", flaky)
    return failed


def test_a_connection_error_on_the_lean_route_is_retried_by_the_client(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis.Redis.from_url(redis_url, retry=Retry(NoBackoff(), 2))
    try:
        sem = Semaphore("lean-retry", 1, redis=client, key_prefix=key_prefix)
        failed = _failing_once(monkeypatch)
        permit = sem.acquire(blocking=False)
        assert failed == ["acquire"]
        assert permit is not None
        assert permit.release() is True
    finally:
        client.close()


@pytest.mark.parametrize("retry", [None, Retry(NoBackoff(), 0)], ids=["default", "zero"])
def test_a_client_without_retries_gets_the_error(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch, retry: Retry | None
) -> None:
    # redis.Redis.from_url() without retry= makes connections that do not retry (redis-py's
    # own route would raise at once too)
    client = redis.Redis.from_url(redis_url, retry=retry)
    try:
        sem = Semaphore("lean-no-retry", 1, redis=client, key_prefix=key_prefix)
        _failing_once(monkeypatch)
        with pytest.raises(SemaphoreBackendError, match="connection reset"):
            sem.acquire(blocking=False)
        assert sem.inspect().used == 0
    finally:
        client.close()


def test_a_reply_left_unread_by_a_timeout_never_answers_the_next_call(
    redis_url: str, key_prefix: str
) -> None:
    """A call that times out leaves its reply on the wire; the connection must not serve
    another call, or that call would read the reply (a grant to another ticket) as its own.
    (redis-py's connection disconnects itself when a read is interrupted; this holds the lean
    route to that.)"""
    client = redis.Redis.from_url(redis_url, socket_timeout=0.2)  # from_url: no retries
    pauser = redis.Redis.from_url(redis_url)
    try:
        sem = Semaphore("lean-timeout", 2, redis=client, key_prefix=key_prefix)
        assert sem.try_acquire("warm:0").permit is not None  # the script is loaded
        pauser.client_pause(600, all=True)
        with pytest.raises(SemaphoreBackendError):
            sem.try_acquire("first:0")  # runs once the pause ends; nobody reads its reply
        time.sleep(0.6)  # the pause is over, the first call's reply has arrived
        second = sem.try_acquire("second:0")
        assert second.status is AttemptStatus.WAITING or second.permit is not None
        holders = {h.token for h in sem.holders()}
        if second.permit is not None:
            assert second.permit.token in holders
        # whatever the first call did, the second call's answer is about the second ticket
        assert ("second:0" in holders) == (second.permit is not None)
    finally:
        pauser.client_unpause()
        pauser.close()
        client.close()
