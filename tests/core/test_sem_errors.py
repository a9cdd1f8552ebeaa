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
    SemaphoreGroup,
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
        ({"adaptive": 1}, TypeError, "adaptive", 1),
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
        (lambda s: s.throttled(-1), ValueError, "retry_after", -1),
        (lambda s: s.throttled(math.nan), ValueError, "retry_after", math.nan),
        (lambda s: s.throttled("5"), TypeError, "retry_after", "5"),
        (lambda s: s.throttled(fencing_token=0), ValueError, "fencing_token", 0),
        (lambda s: s.throttled(fencing_token=1.0), TypeError, "fencing_token", 1.0),
        (lambda s: s.set_rate_override("10"), ValueError, "rate", "10"),
        (lambda s: s.set_rate_override(3.5), TypeError, "rate", 3.5),
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


#: low-level calls whose arguments the scripts would take as they are (a None ticket used to
#: surface as redis-py's DataError; '' and a negative wake_grace were accepted)
_LOW_LEVEL = [
    (lambda s: s.try_acquire(None), TypeError, "ticket", None),
    (lambda s: s.try_acquire(""), ValueError, "ticket", ""),
    (lambda s: s.try_acquire(b"t"), TypeError, "ticket", b"t"),
    (lambda s: s.try_acquire("t", wake_grace=-5), ValueError, "wake_grace", -5),
    (lambda s: s.try_acquire("t", wake_grace=math.nan), ValueError, "wake_grace", math.nan),
    (lambda s: s.try_acquire("t", wake_grace="1"), TypeError, "wake_grace", "1"),
    (lambda s: s.try_acquire("t", epoch=-1), ValueError, "epoch", -1),
    (lambda s: s.try_acquire("t", epoch=1.5), TypeError, "epoch", 1.5),
    (lambda s: s.try_acquire("t", claim=None), TypeError, "claim", None),
    (lambda s: s.try_acquire("t", wake_data=7), TypeError, "wake_data", 7),
    (lambda s: s.release_token(None), TypeError, "token", None),
    (lambda s: s.release_token("t", claim=None), TypeError, "claim", None),
    (lambda s: s.refresh_token(""), ValueError, "token", ""),
    (lambda s: s.withdraw(None), TypeError, "ticket", None),
    (lambda s: s.wait(None, place_ttl=1.0, timeout=0.1), TypeError, "ticket", None),
    (lambda s: s.wait("", place_ttl=1.0, timeout=0.1), ValueError, "ticket", ""),
]


@pytest.mark.parametrize(("call", "exc", "param", "value"), _LOW_LEVEL)
def test_bad_low_level_arguments_are_named_before_touching_redis(
    call: Callable[[Any], object], exc: type[Exception], param: str, value: object
) -> None:
    sem = Semaphore("ok", 2, redis=NOWHERE)
    with pytest.raises(exc) as exc_info:
        call(sem)
    _check(exc_info, param, value)
    assert "is not accepted" in str(exc_info.value) or "must be" in str(exc_info.value)
    assert not isinstance(exc_info.value, redis.RedisError)


@pytest.mark.parametrize(("call", "exc", "param", "value"), _LOW_LEVEL)
def test_bad_low_level_arguments_of_a_group_are_named_too(
    call: Callable[[Any], object], exc: type[Exception], param: str, value: object
) -> None:
    members = [(Semaphore("a", 2, redis=NOWHERE), 1), (Semaphore("b", 2, redis=NOWHERE), 1)]
    group = SemaphoreGroup(members)
    with pytest.raises(exc) as exc_info:
        call(group)
    _check(exc_info, param, value)


def test_an_unknown_keyword_of_try_acquire_is_named_before_touching_redis() -> None:
    sem = Semaphore("ok", 2, redis=NOWHERE)
    with pytest.raises(TypeError, match=r"try_acquire\(\) got unexpected .* prio; it takes "):
        sem.try_acquire("t", prio=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="member_caps"):
        sem.try_acquire("t", member_caps=(1,))  # type: ignore[call-arg]
    members = [(Semaphore("a", 2, redis=NOWHERE), 1), (Semaphore("b", 2, redis=NOWHERE), 1)]
    group = SemaphoreGroup(members)
    with pytest.raises(TypeError, match=r"SemaphoreGroup.try_acquire\(\) got .* weight;"):
        group.try_acquire("t", weight=2)  # type: ignore[call-arg]


def test_the_ticket_error_says_what_a_ticket_is() -> None:
    sem = Semaphore("ok", 2, redis=NOWHERE)
    with pytest.raises(TypeError) as exc_info:
        sem.try_acquire(None)  # type: ignore[arg-type]
    message = str(exc_info.value)
    assert message.startswith("ticket=None (NoneType) is not accepted: use a non-empty str")
    assert "Semaphore.new_ticket()" in message


def test_foreign_value_at_a_semaphore_key_is_left_alone(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    sem = make_semaphore("squatted", 2)
    redis_client.set(sem.keys.expiry, "not yours")
    before = sorted(redis_client.scan_iter(match=key_prefix + "*"))

    for op in _operations(sem):
        with pytest.raises(SemaphoreStateError) as exc_info:
            op()
        err = exc_info.value
        assert err.key == sem.keys.expiry
        assert sem.keys.expiry in str(err)
        assert "string" in str(err)
        assert err.name == "squatted"
        assert isinstance(err, SemaphoreError)

    assert redis_client.get(sem.keys.expiry) == b"not yours"
    assert redis_client.type(sem.keys.expiry) == b"string"
    assert sorted(redis_client.scan_iter(match=key_prefix + "*")) == before


def _operations(sem: Semaphore) -> list[Callable[[], object]]:
    return [
        lambda: sem.acquire(blocking=False),
        lambda: sem.acquire(timeout=0.05),
        lambda: sem.try_acquire("t", place_ttl=5.0),
        lambda: sem.try_acquire("holder", claim="c"),  # already held
        lambda: sem.try_acquire("waiter", place_ttl=5.0),  # has a place
        lambda: sem.try_acquire("released", check_done=True),
        lambda: sem.release_token("t"),
        lambda: sem.release_token("holder"),
        lambda: sem.release_token("released"),
        lambda: sem.refresh_token("t"),
        lambda: sem.refresh_token("holder"),
        lambda: sem.refresh_token("waiter"),
        lambda: sem.withdraw("waiter"),
        lambda: sem.reclaim(),
        lambda: sem.inspect(),
        lambda: sem.throttled(retry_after=5.0),
        lambda: sem.throttled(fencing_token=1),
    ]


def _contents(client: redis.Redis, key: str) -> tuple[object, ...] | None:
    """A key's type and contents, compared by value: DUMP is not stable for a hash stored as
    a hash table (one whose values pass hash-max-listpack-value, e.g. a waiter field with a
    long owner), whose order a mere read may change (incremental rehashing)."""
    kind = client.type(key)
    if kind == b"none":
        return None
    if kind == b"hash":
        return (kind, client.hgetall(key))
    if kind == b"zset":
        return (kind, client.zrange(key, 0, -1, withscores=True))
    if kind == b"list":
        return (kind, client.lrange(key, 0, -1))
    return (kind, client.get(key) if kind == b"string" else None)


@pytest.mark.parametrize(
    ("which", "squat", "rate"),
    [
        ("expiry", lambda c, k: c.set(k, "not yours"), None),
        ("expiry", lambda c, k: c.hset(k, "h:holder", "1"), None),
        ("state", lambda c, k: c.set(k, "not yours"), None),
        ("state", lambda c, k: c.zadd(k, {"used": 0}), None),
        ("line", lambda c, k: c.rpush(k, "waiter"), None),
        ("line", lambda c, k: c.hset(k, "waiter", "1"), None),
        # with a rate, the starts key is read too (a day's window: it outlives the test)
        ("expiry", lambda c, k: c.set(k, "not yours"), "1000/d"),
        ("line", lambda c, k: c.rpush(k, "waiter"), "1000/d"),
        ("starts", lambda c, k: c.set(k, "not yours"), "1000/d"),
        ("starts", lambda c, k: c.hset(k, "1", "1"), "1000/d"),
    ],
)
def test_foreign_type_at_any_key_destroys_no_data(
    make_semaphore: SemaphoreFactory,
    redis_client: redis.Redis,
    key_prefix: str,
    which: str,
    squat: Callable[[redis.Redis, str], object],
    rate: str | None,
) -> None:
    # A semaphore with a holder, a waiter, a tombstone, and entries whose time ran out, so
    # every script has something to reclaim and to write; then one key is replaced by a value
    # of another type.  Every operation must fail naming that key, and leave every key of the
    # semaphore exactly as it was (the scripts read all keys before their first write).
    sem = make_semaphore("squatted-" + which, 2, rate=rate)
    assert sem.try_acquire("holder", claim="c").status.name == "GRANTED"
    assert sem.try_acquire("released").status.name == "GRANTED"
    assert sem.release_token("released") is True
    assert sem.try_acquire("expired").status.name == "GRANTED"
    assert sem.try_acquire("waiter", place_ttl=60.0).status.name == "WAITING"
    assert sem.try_acquire("gone", place_ttl=60.0).status.name == "WAITING"
    expired = {"h:expired": 0, "w:gone": 0}
    assert redis_client.zadd(sem.keys.expiry, expired, xx=True, ch=True) == 2
    key = getattr(sem.keys, which)
    snapshot = {k: _contents(redis_client, k) for k in sem.keys.state_keys()}
    existing = {k for k, v in snapshot.items() if v is not None} | {key}
    assert len(existing) == (3 if rate is None else 4)
    redis_client.delete(key)
    squat(redis_client, key)
    snapshot[key] = _contents(redis_client, key)

    for op in _operations(sem):
        with pytest.raises(SemaphoreStateError) as exc_info:
            op()
        assert exc_info.value.key == key
        assert key in str(exc_info.value)
        assert {k: _contents(redis_client, k) for k in sem.keys.state_keys()} == snapshot
    # set_limit_override stores the override itself, then reclaims: it fails naming the key too
    with pytest.raises(SemaphoreStateError) as exc_info:
        sem.set_limit_override(5)
    assert exc_info.value.key == key
    assert sorted(redis_client.scan_iter(match=key_prefix + "*")) == sorted(
        k.encode() for k in existing
    )


def test_state_error_names_the_key_even_with_spaces_in_the_prefix(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    sem = Semaphore("odd name", 2, redis=redis_client, key_prefix=key_prefix + " with spaces")
    redis_client.hset(sem.keys.line, "field", "value")  # a hash where a sorted set belongs
    with pytest.raises(SemaphoreStateError) as exc_info:
        sem.acquire(blocking=False)
    assert exc_info.value.key == sem.keys.line
    assert re.search(r"holds a hash, expected a zset", str(exc_info.value))
    assert redis_client.hgetall(sem.keys.line) == {b"field": b"value"}


def test_blocking_acquire_reports_the_state_error_not_a_cleanup_error(
    make_semaphore: SemaphoreFactory,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sem = make_semaphore("squatted-blocking", 2)
    redis_client.set(sem.keys.state, "not yours")
    with (
        caplog.at_level(logging.WARNING, logger="celery_semaphore"),
        pytest.raises(SemaphoreStateError) as exc_info,
    ):
        sem.acquire(timeout=1.0)
    assert exc_info.value.key == sem.keys.state
    # the exception is the acquire's own, not one raised while cleaning up after it (that
    # one is logged)
    frames = {entry.name for entry in exc_info.traceback}
    assert "try_acquire" in frames
    assert "_leave" not in frames
    assert "cleanup after waiting failed" in caplog.text
    assert redis_client.get(sem.keys.state) == b"not yours"


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
