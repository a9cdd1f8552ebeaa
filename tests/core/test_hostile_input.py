"""Hostile and malformed input at the public API: only documented exceptions, never a hang,
never a key outside the semaphore's own, never a name that reaches another semaphore's keys.

Every example runs against the real Redis under this test's key prefix; after each one a SCAN
of the prefix must find only keys that start with the semaphore's own ``<prefix>:{<tag>}:``.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest
import redis
from celery import Celery
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from celery_semaphore import Semaphore, SemaphoreError, SemaphoreGroup, limited
from celery_semaphore.core.connection import ACCEPTED_OPTIONS, validate_options
from celery_semaphore.core.keys import MAX_READABLE, SemaphoreKeys, encode_name
from celery_semaphore.integration.config import (
    OPTIONS,
    validate_app_settings,
    validate_task_options,
)
from tests.conftest import delete_prefix

pytestmark = pytest.mark.timeout(240)

FUZZ = settings(
    max_examples=150,
    deadline=None,  # real Redis round trips
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

#: names an attacker would try: brace and colon games, the prefix itself, percent and tilde
#: (the encoding's own escape characters), unicode, NUL, very long
CRAFTED = [
    "}",
    "{",
    "{}",
    "a}:state",
    "a}:b{c",
    "x:{y}:expiry",
    "%7B",
    "%257B",
    "~",
    "%7E",
    "a" * MAX_READABLE,
    "a" * (MAX_READABLE + 1),
    "a" * 5000,
    "é",
    "%C3%A9",
    "\x00",
    "名前",
    "🙂",
    " ",
    "*",
    "?[]\\",
    # code-looking names: they only ever travel as ARGV or inside a key name
    "'); redis.call('FLUSHDB') --",
    "]]..KEYS[1]..[[",
    "%s%d{0}",
]

names = st.one_of(
    st.sampled_from(CRAFTED),
    st.text(min_size=1, max_size=40),
    st.text(alphabet="{}:%~*?[]\\ab", min_size=1, max_size=12),
    st.text(min_size=190, max_size=400),
)
# everything a caller might pass as a number: ints of every size, floats, bools, junk
#: where doubles stop counting exactly, where int64 ends, where milliseconds overflow a float
EDGES = [2**52, 2**52 + 1, 2**53, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 2**70, 1e9, 1e9 + 1, 1e300]
numbers = st.one_of(
    st.sampled_from(EDGES),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-3, max_value=10),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
)

DOCUMENTED = (TypeError, ValueError)


def _keys_under(client: redis.Redis, prefix: str) -> list[str]:
    return [
        k.decode("utf-8", "surrogateescape")
        for k in client.scan_iter(match=f"{prefix}:*", count=1000)
    ]


def _only_own_keys(client: redis.Redis, prefix: str, sem: Semaphore) -> None:
    own = sem.keys.base + ":"
    stray = [k for k in _keys_under(client, prefix) if not k.startswith(own)]
    assert stray == [], f"keys outside semaphore {sem.name!r}'s own ({own!r}): {stray}"
    # and nothing outside the prefix was touched (no FLUSHDB, no stray DEL)
    assert client.get(f"canary-{prefix}") == b"1"


@pytest.fixture
def fuzz_prefix(redis_client: redis.Redis) -> Any:
    prefix = f"csfuzz-{uuid.uuid4().hex[:8]}"
    redis_client.set(f"canary-{prefix}", 1, ex=600)
    yield prefix
    delete_prefix(redis_client, prefix)
    redis_client.delete(f"canary-{prefix}")


@FUZZ
@given(
    name=names,
    limit=st.one_of(st.integers(1, 5), numbers),  # half the time a working semaphore
    weight=st.one_of(st.integers(1, 3), numbers),
    lease_ttl=st.one_of(st.floats(0.5, 60), numbers),
    place_ttl=st.one_of(st.floats(0, 60), numbers),
    poll_interval=numbers,
)
def test_any_name_limit_and_weight_touches_only_its_own_keys(
    redis_client: redis.Redis,
    fuzz_prefix: str,
    name: str,
    limit: Any,
    weight: Any,
    lease_ttl: Any,
    place_ttl: Any,
    poll_interval: Any,
) -> None:
    try:
        sem = Semaphore(name, limit, redis=redis_client, key_prefix=fuzz_prefix, timeout=0)
    except DOCUMENTED:
        event("refused: name or limit")
        return
    try:
        try:
            permit = sem.acquire(weight=weight, blocking=False)
        except DOCUMENTED:
            permit = None
        event("granted" if permit is not None else "not granted")
        try:  # the timing parameters: accepted and obeyed, or refused, never anything else
            timed = Semaphore(
                name,
                sem.limit,
                redis=redis_client,
                key_prefix=fuzz_prefix,
                lease_ttl=lease_ttl,
                poll_interval=poll_interval,
            )
            kept = timed.new_ticket()
            extra = timed.acquire(blocking=False, ticket=kept, place_ttl=place_ttl)
        except DOCUMENTED:
            extra = None
        else:
            timed.withdraw(kept)  # not granted: it kept its place in line; give it up
        if extra is not None:
            extra.release()
        snap = sem.inspect()
        assert snap.name == name
        if permit is not None:
            assert snap.used == weight
            assert [h.token for h in snap.holders] == [permit.token]
            assert permit.refresh() is True
            assert permit.release() is True
        assert sem.inspect().used == 0
        ticket = Semaphore.new_ticket()
        attempt = sem.try_acquire(ticket, place_ttl=1)
        assert attempt.permit is not None
        attempt.permit.release()
        assert sem.withdraw(ticket) is False
        assert sem.reclaim() == 0
        _only_own_keys(redis_client, fuzz_prefix, sem)
    finally:
        delete_prefix(redis_client, fuzz_prefix)


@FUZZ
@given(a=names, b=names)
def test_two_distinct_names_never_share_or_reach_each_others_keys(
    redis_client: redis.Redis, fuzz_prefix: str, a: str, b: str
) -> None:
    assume(a != b)
    ka, kb = SemaphoreKeys.for_name(a, fuzz_prefix), SemaphoreKeys.for_name(b, fuzz_prefix)
    assert encode_name(a) != encode_name(b)
    assert not set(ka.state_keys()) & set(kb.state_keys())
    # the hash tag is the text between the first '{' and the next '}': exactly the encoding
    for key in ka.state_keys():
        tag = key[key.index("{") + 1 : key.index("}")]
        assert tag == encode_name(a)
    sem_a = Semaphore(a, 1, redis=redis_client, key_prefix=fuzz_prefix)
    sem_b = Semaphore(b, 1, redis=redis_client, key_prefix=fuzz_prefix)
    try:
        held = sem_a.acquire(blocking=False)
        assert held is not None
        assert sem_b.inspect().used == 0  # b is untouched by a's grant
        other = sem_b.acquire(blocking=False)
        assert other is not None  # and a's grant does not fill b
        other.release()
        held.release()
    finally:
        delete_prefix(redis_client, fuzz_prefix)


def test_a_name_equal_to_the_prefix_or_built_from_another_key_stays_apart(
    redis_client: redis.Redis, fuzz_prefix: str
) -> None:
    victim = Semaphore("pay", 1, redis=redis_client, key_prefix=fuzz_prefix)
    permit = victim.acquire(blocking=False)
    assert permit is not None
    attackers = [
        fuzz_prefix,
        f"{fuzz_prefix}:{{pay}}",
        "pay}:state",
        "pay}",
        "{pay}",
        victim.keys.state,
        victim.keys.base,
        "pay:state",
    ]
    try:
        for name in attackers:
            sem = Semaphore(name, 1, redis=redis_client, key_prefix=fuzz_prefix)
            other = sem.acquire(blocking=False)
            assert other is not None, name  # its own, empty semaphore: never the victim's
            assert sem.inspect().holders[0].token == other.token
            other.release()
            assert not set(sem.keys.state_keys()) & set(victim.keys.state_keys())
        assert [h.token for h in victim.holders()] == [permit.token]
    finally:
        permit.release()


@FUZZ
@given(ticket=names, claim=st.text(max_size=50), data=st.text(max_size=50))
def test_hostile_tickets_claims_and_wake_data_stay_inside(
    redis_client: redis.Redis, fuzz_prefix: str, ticket: str, claim: str, data: str
) -> None:
    sem = Semaphore("t", 1, redis=redis_client, key_prefix=fuzz_prefix, on_wake=lambda t, d: None)
    try:
        blocker = sem.acquire(blocking=False)
        assert blocker is not None
        try:
            attempt = sem.try_acquire(ticket, place_ttl=2, claim=claim, wake_data=data)
        except DOCUMENTED:
            return
        assert attempt.permit is None
        [waiter] = sem.waiters()
        assert waiter.ticket == ticket
        blocker.release()
        granted = sem.try_acquire(ticket, place_ttl=2, claim=claim, wake_data=data)
        assert granted.permit is not None
        assert granted.permit.release() is True
        _only_own_keys(redis_client, fuzz_prefix, sem)
    finally:
        delete_prefix(redis_client, fuzz_prefix)


@FUZZ
@given(
    owner=st.dictionaries(
        st.text(max_size=10), st.one_of(st.text(max_size=20), st.integers(), st.none())
    )
)
def test_any_owner_metadata_round_trips_as_json(
    redis_client: redis.Redis, fuzz_prefix: str, owner: dict[str, Any]
) -> None:
    sem = Semaphore("o", 1, redis=redis_client, key_prefix=fuzz_prefix)
    try:
        permit = sem.acquire(blocking=False, owner=owner)
        assert permit is not None
        assert sem.holders()[0].owner == owner
        permit.release()
    finally:
        delete_prefix(redis_client, fuzz_prefix)


def test_lone_surrogates_are_refused_before_redis() -> None:
    with pytest.raises(ValueError, match="UTF-8"):
        Semaphore("\ud800", 1, redis="redis://127.0.0.1:1/0")


# -- options and settings ---------------------------------------------------------------------

option_values = st.one_of(numbers, st.sampled_from(["log", "raise", "ignore", ""]))


@settings(max_examples=200, deadline=None)
@given(
    options=st.dictionaries(
        st.sampled_from([*OPTIONS, "weight", "lease_tll", "Lease_TTL"]), option_values, max_size=4
    ),
    name=names,
    limit=numbers,
)
def test_limited_accepts_or_refuses_with_a_documented_error(
    options: dict[str, Any], name: Any, limit: Any
) -> None:
    try:
        deco = limited(name, limit, **options)
    except DOCUMENTED:
        return
    app = Celery("fuzz", set_as_current=False)

    def body(self: Any) -> None:
        return None

    try:
        # a name with {placeholders} is a template of the task's parameters, checked here
        app.task(bind=True, shared=False)(deco(body))
    except DOCUMENTED:
        return
    # what was accepted is what a worker accepts: checked again with the app's settings
    validate_task_options(options, where="fuzz")


setting_values = st.one_of(
    option_values,
    st.dictionaries(st.text(max_size=8), numbers, max_size=3),
    st.lists(st.integers(), max_size=2),
    st.sampled_from(
        [
            "redis://localhost:6379/0",
            "rediss://u:p@h:1/0",
            "sentinel://h:26379;sentinel://h2:26379",
            "redis://a:1;redis://b:1",
            "http://x",
            "redis://",
            "unix:///tmp/r.sock",
            "0.0.0.0",
            "a{b}",
        ]
    ),
)
APP_ONLY = [
    "semaphore_redis_url",
    "semaphore_redis_cluster",
    "semaphore_redis_options",
    "semaphore_key_prefix",
    "semaphore_limits",
    "semaphore_enabled",
    "semaphore_eager_timeout",
    "semaphore_worker_hold",
    "semaphore_metrics_port",
    "semaphore_metrics_address",
]


@settings(max_examples=300, deadline=None)
@given(
    conf=st.dictionaries(
        st.sampled_from([*APP_ONLY, *(o.setting for o in OPTIONS.values())]),
        setting_values,
        max_size=4,
    )
)
def test_settings_are_accepted_or_refused_with_a_documented_error(conf: dict[str, Any]) -> None:
    try:
        validate_app_settings(conf)
    except DOCUMENTED as exc:
        message = str(exc)
    else:
        return
    assert "semaphore_" in message or "key_prefix" in message, message


@settings(max_examples=200, deadline=None)
@given(
    options=st.dictionaries(
        st.one_of(st.sampled_from(list(ACCEPTED_OPTIONS)), st.text(max_size=8)),
        st.one_of(numbers, st.dictionaries(st.text(max_size=5), numbers, max_size=2)),
        max_size=4,
    ),
    url=st.sampled_from(["redis://h:1/0", "sentinel://h:26379/0"]),
)
def test_connection_options_are_accepted_or_refused_naming_the_setting(
    options: dict[str, Any], url: str
) -> None:
    try:
        checked = validate_options("semaphore_redis_options", options, url=url)
    except DOCUMENTED as exc:
        message = str(exc)
    else:
        message = ""
    if message:
        assert "semaphore_redis_options" in message
        return
    assert set(checked) <= set(ACCEPTED_OPTIONS)
    for key in ("socket_timeout", "socket_connect_timeout"):
        if key in checked:
            assert math.isfinite(checked[key]) or checked[key] == math.inf


def test_semaphore_errors_are_documented_exceptions() -> None:
    # the only exceptions the fuzzed calls above may raise besides TypeError/ValueError
    assert issubclass(SemaphoreError, Exception)


# -- hash tags: several semaphores in one slot, still never sharing a key ---------------------

tags = st.one_of(st.none(), names)


@FUZZ
@given(a=st.tuples(tags, names), b=st.tuples(tags, names))
def test_hash_tag_and_name_pairs_never_share_keys(
    redis_client: redis.Redis,
    fuzz_prefix: str,
    a: tuple[str | None, str],
    b: tuple[str | None, str],
) -> None:
    assume(a != b)
    ka = SemaphoreKeys.for_name(a[1], fuzz_prefix, a[0])
    kb = SemaphoreKeys.for_name(b[1], fuzz_prefix, b[0])
    assert not set(ka.state_keys()) & set(kb.state_keys())
    for keys, (tag, name) in ((ka, a), (kb, b)):
        for key in keys.state_keys():
            # the hash tag is the text between the first '{' and the next '}'
            assert key[key.index("{") + 1 : key.index("}")] == encode_name(
                name if tag is None else tag
            )
    sem_a = Semaphore(a[1], 1, redis=redis_client, key_prefix=fuzz_prefix, hash_tag=a[0])
    sem_b = Semaphore(b[1], 1, redis=redis_client, key_prefix=fuzz_prefix, hash_tag=b[0])
    try:
        held = sem_a.acquire(blocking=False)
        assert held is not None
        other = sem_b.acquire(blocking=False)  # b is its own semaphore, empty
        assert other is not None
        assert sem_a.inspect().holders[0].token == held.token
        other.release()
        held.release()
        stray = [
            k
            for k in _keys_under(redis_client, fuzz_prefix)
            if not k.startswith((sem_a.keys.base + ":", sem_b.keys.base + ":"))
        ]
        assert stray == []
    finally:
        delete_prefix(redis_client, fuzz_prefix)


@FUZZ
@given(
    tag=names,
    # weights are fuzzed above; here every group is valid, so every example reaches Redis
    members=st.lists(
        st.tuples(names, st.integers(1, 3)), min_size=1, max_size=4, unique_by=lambda m: m[0]
    ),
)
def test_groups_of_hostile_names_only_touch_their_members_keys(
    redis_client: redis.Redis, fuzz_prefix: str, tag: str, members: list[tuple[str, Any]]
) -> None:
    sems = [
        Semaphore(name, 3, redis=redis_client, key_prefix=fuzz_prefix, hash_tag=tag)
        for name, _ in members
    ]
    try:
        group = SemaphoreGroup([(s, w) for s, (_, w) in zip(sems, members, strict=True)])
    except DOCUMENTED:
        event("group refused (duplicate names or bad weights)")
        return
    try:
        permit = group.acquire(blocking=False)
        assert permit is not None  # every member is empty and every weight fits
        for sem, (_, weight) in zip(sems, members, strict=True):
            assert sem.inspect().used == weight
        assert permit.release() is True
        assert all(s.inspect().used == 0 for s in sems)
        bases = tuple(s.keys.base + ":" for s in sems)
        assert [k for k in _keys_under(redis_client, fuzz_prefix) if not k.startswith(bases)] == []
    finally:
        delete_prefix(redis_client, fuzz_prefix)
