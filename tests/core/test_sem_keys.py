"""Key naming: one cluster slot per semaphore, no overlap between names, prefix first."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from celery_semaphore import Semaphore
from celery_semaphore.core.keys import MAX_READABLE, SemaphoreKeys, encode_name, validate_prefix

PREFIX = "cs-keys"
LONG = "x" * 1000
AWKWARD_NAMES = [
    "plain",
    "with space",
    "ünïcødé ☃ 名前",
    "{braces}",
    "}{",
    "{",
    "}",
    "a:b:c",
    "50%",
    "%7B",
    "%7E",
    "~",
    "a~b",
    PREFIX,
    f"{PREFIX}:{{x}}",
    "holders",
    "x}:holders",
    "expiry",
    "x}:state",
    "line",
    LONG,
    LONG + "y",
    "x" * (MAX_READABLE + 1),
    encode_name(LONG),  # a name spelled like another name's hashed tag
    "\n\t\x00",
    "🙂" * 100,
]


def all_keys(keys: SemaphoreKeys) -> list[str]:
    return [*keys.state_keys(), keys.wake("some-ticket"), keys.wake("{other}:ticket")]


def hash_tag(key: str) -> str:
    start = key.index("{")
    end = key.index("}", start + 1)
    return key[start + 1 : end]


@pytest.mark.parametrize("name", AWKWARD_NAMES)
def test_all_keys_of_one_semaphore_share_one_slot(name: str) -> None:
    keys = SemaphoreKeys.for_name(name, PREFIX)
    slots = {key_slot(k.encode("utf-8")) for k in all_keys(keys)}
    assert len(slots) == 1
    for key in all_keys(keys):
        assert key.startswith(PREFIX + ":{")
        assert hash_tag(key) == encode_name(name)
    assert len(set(keys.state_keys())) == 4


def test_distinct_names_never_share_keys() -> None:
    key_sets = {name: set(all_keys(SemaphoreKeys.for_name(name, PREFIX))) for name in AWKWARD_NAMES}
    for a, b in itertools.combinations(AWKWARD_NAMES, 2):
        assert key_sets[a].isdisjoint(key_sets[b]), (a, b)
        assert encode_name(a) != encode_name(b), (a, b)


def test_hashed_tag_cannot_be_forged_by_a_short_name() -> None:
    # Regression: quote() leaves "~" alone, so a name spelled exactly like a long name's
    # "<head>~<sha256>" tag used to encode to that same tag and share its keys.
    long_name = "a" * 300
    forged = encode_name(long_name)
    assert "~" in forged
    assert encode_name(forged) != forged
    assert encode_name(forged) != encode_name(long_name)


def test_semaphore_uses_prefix_and_encoded_name() -> None:
    sem = Semaphore("a name", 2, redis="redis://127.0.0.1:1/0", key_prefix="my app")
    assert sem.keys.expiry == "my app:{a%20name}:expiry"
    assert sem.keys.base == "my app:{a%20name}"


def test_long_names_have_bounded_keys() -> None:
    tag = encode_name("x" * 1000)
    assert len(tag) <= MAX_READABLE
    assert tag.startswith("x" * 64 + "~")
    assert len(encode_name("名" * 1000)) <= MAX_READABLE


@pytest.mark.parametrize("prefix", ["a{b", "a}b", "{", "}", "x{y}z"])
def test_prefix_with_braces_is_rejected(prefix: str) -> None:
    with pytest.raises(ValueError, match="key_prefix"):
        validate_prefix(prefix)
    with pytest.raises(ValueError, match=r"key_prefix=.*not accepted"):
        Semaphore("x", 1, redis="redis://127.0.0.1:1/0", key_prefix=prefix)


def test_empty_or_non_str_prefix_is_rejected() -> None:
    with pytest.raises(ValueError, match="key_prefix"):
        Semaphore("x", 1, redis="redis://127.0.0.1:1/0", key_prefix="")
    with pytest.raises(TypeError, match="key_prefix"):
        Semaphore("x", 1, redis="redis://127.0.0.1:1/0", key_prefix=b"x")  # type: ignore[arg-type]


# Names made of the characters that matter to the encoding, so collisions are likely to be
# tried; plus arbitrary text.
_TRICKY = st.text(alphabet="ab~%7E{}:- .☃", min_size=1, max_size=20)
NAMES = st.one_of(
    _TRICKY,
    st.text(min_size=1, max_size=300),
    st.builds(lambda n, k: n * k, _TRICKY, st.integers(min_value=10, max_value=60)),
)


def _forgeries(name: str) -> list[str]:
    # names spelled like this name's tag (or its percent-decoding)
    tag = encode_name(name)
    return [tag, unquote(tag)]


@settings(max_examples=300, deadline=None)
@given(a=NAMES, b=NAMES)
def test_encode_name_is_injective(a: str, b: str) -> None:
    for x, y in [(a, b), *((a, f) for f in _forgeries(b)), *((b, f) for f in _forgeries(a))]:
        if x != y:
            assert encode_name(x) != encode_name(y), (x, y)


@settings(max_examples=200, deadline=None)
@given(name=NAMES)
def test_encoded_name_is_brace_free_and_readable(name: str) -> None:
    tag = encode_name(name)
    assert "{" not in tag
    assert "}" not in tag
    assert len(tag) <= MAX_READABLE
    if "~" not in tag:  # the plain form decodes back to the name
        assert unquote(tag, errors="strict") == name
    keys = SemaphoreKeys.for_name(name, PREFIX)
    assert len({key_slot(k.encode("utf-8")) for k in all_keys(keys)}) == 1


TAGS = ["shared", "{x}", "a:b", "名", "x" * 500]


@pytest.mark.parametrize("tag", TAGS)
def test_names_sharing_a_hash_tag_share_one_slot_but_no_key(tag: str) -> None:
    key_sets = {name: all_keys(SemaphoreKeys.for_name(name, PREFIX, tag)) for name in AWKWARD_NAMES}
    slots = {key_slot(k.encode("utf-8")) for keys in key_sets.values() for k in keys}
    assert slots == {key_slot(encode_name(tag).encode("utf-8"))}
    for a, b in itertools.combinations(AWKWARD_NAMES, 2):
        assert set(key_sets[a]).isdisjoint(key_sets[b]), (a, b)
    # nor any key of a semaphore without a hash tag (not even one named like the tag), nor of
    # the same names under another tag
    untagged = {
        k for name in [*AWKWARD_NAMES, tag] for k in all_keys(SemaphoreKeys.for_name(name, PREFIX))
    }
    other = {
        k
        for name in AWKWARD_NAMES
        for k in all_keys(SemaphoreKeys.for_name(name, PREFIX, tag + "2"))
    }
    for keys in key_sets.values():
        assert untagged.isdisjoint(keys)
        assert other.isdisjoint(keys)


@settings(max_examples=200, deadline=None)
@given(a=NAMES, b=NAMES, tag=NAMES)
def test_tagged_keys_are_injective(a: str, b: str, tag: str) -> None:
    ka, kb = SemaphoreKeys.for_name(a, PREFIX, tag), SemaphoreKeys.for_name(b, PREFIX, tag)
    if a != b:
        assert set(all_keys(ka)).isdisjoint(all_keys(kb))
    assert len({key_slot(k.encode("utf-8")) for k in [*all_keys(ka), *all_keys(kb)]}) == 1
    # a wake key of an untagged semaphore never equals a key of a tagged one
    plain = SemaphoreKeys.for_name(tag, PREFIX)
    assert plain.wake(b) not in all_keys(ka)


def test_semaphores_sharing_a_hash_tag_are_independent(
    make_semaphore: Callable[..., Semaphore],
) -> None:
    one = make_semaphore("one", 1, hash_tag="pair")
    two = make_semaphore("two", 1, hash_tag="pair")
    plain = make_semaphore("pair", 1)
    assert one.keys.state != two.keys.state
    assert one.keys.base.endswith(":{pair}:n:one")
    permits = [s.acquire(blocking=False) for s in (one, two, plain)]
    assert all(p is not None for p in permits)
    assert [s.inspect().used for s in (one, two, plain)] == [1, 1, 1]
    with pytest.raises(ValueError, match="hash_tag"):
        make_semaphore("three", 1, hash_tag="")
