"""Bad arguments, foreign data in our keys, and an unreachable Redis all fail loudly and clearly."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_semaphore import (
    Semaphore,
    SemaphoreBackendError,
    SemaphoreError,
    SemaphoreStateError,
)

SemaphoreFactory = Callable[..., Semaphore]
NOWHERE = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def _check(exc_info: pytest.ExceptionInfo[Exception], param: str, value: object) -> None:
    message = str(exc_info.value)
    assert param in message, message
    assert repr(value) in message or str(value) in message, message


@pytest.mark.parametrize(
    ("kwargs", "exc", "param", "value"),
    [
        ({"limit": 0}, ValueError, "limit", 0),
        ({"limit": -3}, ValueError, "limit", -3),
        ({"limit": True}, TypeError, "limit", True),
        ({"limit": 2.0}, TypeError, "limit", 2.0),
        ({"limit": "3"}, TypeError, "limit", "3"),
        ({"limit": None}, TypeError, "limit", None),
        ({"name": ""}, ValueError, "name", ""),
        ({"name": 42}, TypeError, "name", 42),
        ({"name": b"bytes"}, TypeError, "name", b"bytes"),
        ({"name": None}, TypeError, "name", None),
        ({"name": "\ud800"}, ValueError, "name", "\ud800"),
        ({"lease_ttl": 0}, ValueError, "lease_ttl", 0),
        ({"lease_ttl": -1.5}, ValueError, "lease_ttl", -1.5),
        ({"lease_ttl": math.nan}, ValueError, "lease_ttl", math.nan),
        ({"lease_ttl": math.inf}, ValueError, "lease_ttl", math.inf),
        ({"lease_ttl": "10"}, TypeError, "lease_ttl", "10"),
        ({"lease_ttl": True}, TypeError, "lease_ttl", True),
        ({"poll_interval": 0}, ValueError, "poll_interval", 0),
        ({"timeout": -1}, ValueError, "timeout", -1),
        ({"timeout": math.nan}, ValueError, "timeout", math.nan),
        ({"redis": "http://x"}, ValueError, "redis", "http://x"),
        ({"redis": "localhost:6379"}, ValueError, "redis", "localhost:6379"),
        ({"redis": 6379}, TypeError, "redis", 6379),
        ({"redis": object}, TypeError, "redis", "object"),
        ({"redis": {"host": "x"}}, TypeError, "redis", {"host": "x"}),
        ({"key_prefix": "a{b}"}, ValueError, "key_prefix", "a{b}"),
        ({"key_prefix": 1}, TypeError, "key_prefix", 1),
    ],
)
def test_bad_constructor_arguments(
    kwargs: dict[str, Any], exc: type[Exception], param: str, value: object
) -> None:
    args: dict[str, Any] = {"name": "ok", "limit": 2, "redis": NOWHERE, **kwargs}
    with pytest.raises(exc) as exc_info:
        Semaphore(**args)
    _check(exc_info, param, value)


@pytest.mark.parametrize(
    ("call", "exc", "param", "value"),
    [
        (lambda s: s.acquire(weight=0), ValueError, "weight", 0),
        (lambda s: s.acquire(weight=3), ValueError, "weight", 3),
        (lambda s: s.acquire(weight=-1, blocking=False), ValueError, "weight", -1),
        (lambda s: s.acquire(weight=1.0), TypeError, "weight", 1.0),
        (lambda s: s.acquire(weight=True), TypeError, "weight", True),
        (lambda s: s.acquire(timeout=-1), ValueError, "timeout", -1),
        (lambda s: s.acquire(timeout=math.inf), ValueError, "timeout", math.inf),
        (lambda s: s.acquire(ticket=""), ValueError, "ticket", ""),
        (lambda s: s.acquire(ticket=7), TypeError, "ticket", 7),
        (lambda s: s.try_acquire("t", weight=5), ValueError, "weight", 5),
        (lambda s: s.try_acquire("t", place_ttl=-1), ValueError, "place_ttl", -1),
        (lambda s: s.try_acquire("t", lease_ttl=0), ValueError, "lease_ttl", 0),
        (
            lambda s: s.release_token("t", tombstone_ttl=math.nan),
            ValueError,
            "tombstone_ttl",
            "nan",
        ),
        (lambda s: s.refresh_token("t", lease_ttl=-2), ValueError, "lease_ttl", -2),
        (lambda s: s.set_limit_override(0), ValueError, "limit", 0),
        (lambda s: s.set_limit_override(1.5), TypeError, "limit", 1.5),
    ],
)
def test_bad_call_arguments_fail_before_touching_redis(
    call: Callable[[Semaphore], object], exc: type[Exception], param: str, value: object
) -> None:
    # pointed at nothing: a call that reached Redis would raise SemaphoreBackendError instead
    sem = Semaphore("ok", 2, redis=NOWHERE)
    with pytest.raises(exc) as exc_info:
        call(sem)
    _check(exc_info, param, value)


def test_foreign_value_at_a_semaphore_key_is_left_alone(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    sem = make_semaphore("squatted", 2)
    redis_client.set(sem.keys.holders, "not yours")
    before = sorted(redis_client.scan_iter(match=key_prefix + "*"))

    operations: list[Callable[[], object]] = [
        lambda: sem.acquire(blocking=False),
        lambda: sem.acquire(timeout=0.05),
        lambda: sem.try_acquire("t", place_ttl=5.0),
        lambda: sem.release_token("t"),
        lambda: sem.refresh_token("t"),
        lambda: sem.withdraw("t"),
        lambda: sem.reclaim(),
        lambda: sem.inspect(),
    ]
    for op in operations:
        with pytest.raises(SemaphoreStateError) as exc_info:
            op()
        err = exc_info.value
        assert err.key == sem.keys.holders
        assert sem.keys.holders in str(err)
        assert "string" in str(err)
        assert err.name == "squatted"
        assert isinstance(err, SemaphoreError)

    assert redis_client.get(sem.keys.holders) == b"not yours"
    assert redis_client.type(sem.keys.holders) == b"string"
    assert sorted(redis_client.scan_iter(match=key_prefix + "*")) == before


def test_state_error_names_the_key_even_with_spaces_in_the_prefix(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    sem = Semaphore("odd name", 2, redis=redis_client, key_prefix=key_prefix + " with spaces")
    redis_client.hset(sem.keys.waiters, "field", "value")  # a hash where a sorted set belongs
    with pytest.raises(SemaphoreStateError) as exc_info:
        sem.acquire(blocking=False)
    assert exc_info.value.key == sem.keys.waiters
    assert re.search(r"holds a hash, expected a zset", str(exc_info.value))
    assert redis_client.hgetall(sem.keys.waiters) == {b"field": b"value"}


def test_blocking_acquire_reports_the_state_error_not_a_cleanup_error(
    make_semaphore: SemaphoreFactory,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sem = make_semaphore("squatted-blocking", 2)
    redis_client.set(sem.keys.meta, "not yours")
    with (
        caplog.at_level(logging.WARNING, logger="celery_semaphore"),
        pytest.raises(SemaphoreStateError) as exc_info,
    ):
        sem.acquire(timeout=1.0)
    assert exc_info.value.key == sem.keys.meta
    # the exception is the acquire's own, not one raised while cleaning up after it (that
    # one is logged)
    frames = {entry.name for entry in exc_info.traceback}
    assert "try_acquire" in frames
    assert "_leave" not in frames
    assert "cleanup after waiting failed" in caplog.text
    assert redis_client.get(sem.keys.meta) == b"not yours"


def _dead_client() -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1",
        port=1,
        socket_connect_timeout=0.2,
        socket_timeout=0.2,
        retry=Retry(NoBackoff(), 0),
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.acquire(blocking=False),
        lambda s: s.acquire(timeout=0.1),
        lambda s: s.release_token("t"),
        lambda s: s.inspect(),
        lambda s: s.set_limit_override(1),
    ],
)
def test_unreachable_redis_raises_backend_error(call: Callable[[Semaphore], object]) -> None:
    sem = Semaphore("offline", 2, redis=_dead_client())
    with pytest.raises(SemaphoreBackendError) as exc_info:
        call(sem)
    err = exc_info.value
    assert isinstance(err.__cause__, redis.ConnectionError)
    assert isinstance(err, ConnectionError)  # the builtin, so generic handlers catch it too
    assert err.name == "offline"
    assert "offline" in str(err)


def test_unreachable_redis_url_raises_backend_error() -> None:
    sem = Semaphore("offline-url", 2, redis=NOWHERE + "?socket_connect_timeout=0.2")
    with pytest.raises(SemaphoreBackendError) as exc_info:
        sem.acquire(blocking=False)
    assert isinstance(exc_info.value.__cause__, redis.ConnectionError)
