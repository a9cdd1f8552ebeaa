"""Keys of ``semaphore_limits``, ``semaphore_queue_limits`` and ``semaphore_queue_weights``:
exact names, name templates and glob patterns.

A key is one of:

* an exact semaphore name (``"openai"``, ``"api:42"``);
* the name template of a dynamic name, as written in code (``"api:{customer_id}"``);
* a glob pattern (:func:`fnmatch.fnmatchcase`: ``*`` any text, ``?`` one character,
  ``[abc]``/``[a-z]``/``[!abc]`` one character of a set), when it has ``*``, ``?`` or ``[``.

Which key applies to a semaphore (:class:`Lookup`): its exact concrete name, then its name
template, then the patterns matching either; of several patterns the most specific wins: the
one with the most literal (non-wildcard) characters, ties going to the key given first.

:func:`could_match` decides, for the warning a worker logs at start, whether a key could ever
name a semaphore of the app's tasks, a dynamic name's template included: it is conservative
(a key is reported only when it surely matches nothing).
"""

from __future__ import annotations

import fnmatch
import re
import string
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Generic, TypeVar

from ..core import _validate

__all__ = ["Lookup", "check_key", "could_match", "is_pattern", "specificity"]

_V = TypeVar("_V")

#: the characters that make a key a glob pattern
WILDCARDS = frozenset("*?[")

#: what a key may be, for error messages
ACCEPTED = (
    "use an exact semaphore name ('openai'), a name template as written in code "
    "('api:{customer_id}') or a glob pattern ('llm:*', 'db-?', 'shard-[0-9]')"
)


def is_pattern(key: str) -> bool:
    """Whether ``key`` has a glob wildcard (``*``, ``?`` or ``[``)."""
    return not WILDCARDS.isdisjoint(key)


# -- glob pattern -> tokens -------------------------------------------------------------------
#
# A token is ("lit", char), ("one", None) for ``?``, ("set", bracket text) for ``[...]`` or
# ("any", None) for ``*`` (and, in a template, a placeholder: any text).

_Token = tuple[str, str | None]


@lru_cache(maxsize=1024)
def _glob_tokens(pattern: str) -> tuple[_Token, ...]:
    """The tokens of a glob pattern, bracket rules as in :func:`fnmatch.translate`."""
    out: list[_Token] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            if not out or out[-1][0] != "any":
                out.append(("any", None))
        elif c == "?":
            out.append(("one", None))
        elif c == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:  # no closing bracket: a literal '['
                out.append(("lit", "["))
            else:
                out.append(("set", pattern[i - 1 : j + 1]))
                i = j + 1
        else:
            out.append(("lit", c))
    return tuple(out)


@lru_cache(maxsize=1024)
def _set_matcher(bracket: str) -> Callable[[str], object]:
    return re.compile(fnmatch.translate(bracket)).match


def _set_is_empty(bracket: str) -> bool:
    """A ``[...]`` that matches no character (only reversed ranges, e.g. ``[z-a]``):
    :func:`fnmatch.translate` writes it as ``(?!)``."""
    return "(?!)" in fnmatch.translate(bracket)


def specificity(key: str) -> int:
    """How many literal (non-wildcard) characters a pattern has."""
    return sum(1 for kind, _ in _glob_tokens(key) if kind == "lit")


def check_key(param: str, key: object) -> str:
    """A key of a per-semaphore setting: a non-empty str; a pattern must be able to match."""
    if not isinstance(key, str):
        raise TypeError(
            f"{param} keys must be semaphore names (str), got {type(key).__name__} {key!r}; "
            f"{ACCEPTED}"
        )
    if not key:
        raise ValueError(f"{param} key {key!r} is not accepted: it is empty; {ACCEPTED}")
    _validate.name(f"{param} key", key)
    if is_pattern(key):
        empty = [t for kind, t in _glob_tokens(key) if kind == "set" and _set_is_empty(str(t))]
        if empty:
            raise ValueError(
                f"{param} key {key!r} is not accepted: the pattern can match no name (the "
                f"character set {empty[0]} holds no character: its range is reversed); "
                f"{ACCEPTED}"
            )
    return key


# -- the lookup ---------------------------------------------------------------------------------


class Lookup(Generic[_V]):
    """The values of a per-semaphore setting in the order they apply to a semaphore.

    Built once per settings generation (see :func:`celery_semaphore.integration.memo.memo`);
    which patterns match a tuple of names is remembered (at most :attr:`CACHE_SIZE` tuples),
    so a call pays a dict look-up, not a regular expression per pattern.
    """

    CACHE_SIZE = 4096

    def __init__(self, table: Mapping[str, _V] | None) -> None:
        table = dict(table or {})
        self.exact: dict[str, _V] = table
        ordered = sorted(
            ((i, k, v) for i, (k, v) in enumerate(table.items()) if is_pattern(k)),
            key=lambda item: (-specificity(item[1]), item[0]),
        )
        #: (match, value) of each pattern key, most specific first
        self.patterns: tuple[tuple[Callable[[str], object], _V], ...] = tuple(
            (re.compile(fnmatch.translate(k)).match, v) for _, k, v in ordered
        )
        self._cache: dict[tuple[str, ...], tuple[_V, ...]] = {}
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self.exact)

    def _matching(self, names: tuple[str, ...]) -> tuple[_V, ...]:
        found = self._cache.get(names)
        if found is None:
            found = tuple(v for match, v in self.patterns if any(match(n) for n in names))
            with self._lock:
                if len(self._cache) >= self.CACHE_SIZE:
                    self._cache.clear()
                self._cache[names] = found
        return found

    def candidates(self, names: Sequence[str]) -> Iterable[_V]:
        """The values that apply to a semaphore known by ``names`` (its concrete name, then its
        template), first to last: exact keys in the order of ``names``, then the matching
        patterns, most specific first."""
        exact = self.exact
        for name in names:
            if name in exact:
                yield exact[name]
        if self.patterns:
            yield from self._matching(tuple(names))

    def first(self, names: Sequence[str]) -> _V | None:
        """The value that applies, or None."""
        return next(iter(self.candidates(names)), None)


# -- could a key name a semaphore of the app? -----------------------------------------------------


def _template_tokens(text: str) -> tuple[_Token, ...]:
    """The tokens of a name template: its literal text, and any text for each placeholder."""
    out: list[_Token] = []
    for literal, field, _spec, _conv in string.Formatter().parse(text):
        out.extend(("lit", c) for c in literal)
        if field is not None and (not out or out[-1][0] != "any"):
            out.append(("any", None))
    return tuple(out)


def _one_char_overlap(a: _Token, b: _Token) -> bool:
    """Whether single-character tokens ``a`` and ``b`` can match the same character."""
    if a[0] == "one" or b[0] == "one":
        return True
    if a[0] == "lit" and b[0] == "lit":
        return a[1] == b[1]
    if a[0] == "lit":
        return bool(_set_matcher(str(b[1]))(str(a[1])))
    if b[0] == "lit":
        return bool(_set_matcher(str(a[1]))(str(b[1])))
    return True  # two sets: assume they share a character (conservative)


def _overlap(a: tuple[_Token, ...], b: tuple[_Token, ...]) -> bool:
    """Whether some text matches both token sequences (``any`` is any text)."""
    seen: set[tuple[int, int]] = set()
    stack = [(0, 0)]
    while stack:
        i, j = stack.pop()
        if (i, j) in seen:
            continue
        seen.add((i, j))
        if i == len(a) and j == len(b):
            return True
        ta = a[i] if i < len(a) else None
        tb = b[j] if j < len(b) else None
        if ta is not None and ta[0] == "any":
            stack.append((i + 1, j))  # it matches nothing more
            if tb is not None:
                stack.append((i, j + 1))  # it takes b's character (or b's any-text)
        if tb is not None and tb[0] == "any":
            stack.append((i, j + 1))
            if ta is not None:
                stack.append((i + 1, j))
        if (
            ta is not None
            and tb is not None
            and ta[0] != "any"
            and tb[0] != "any"
            and _one_char_overlap(ta, tb)
        ):
            stack.append((i + 1, j + 1))
    return False


def could_match(key: str, static: Iterable[str], templates: Iterable[str]) -> bool:
    """Whether ``key`` (exact name, template text or pattern) names, or could name, one of the
    ``static`` names or a name some template in ``templates`` produces."""
    static = list(static)
    templates = list(templates)
    if key in static or key in templates:
        return True
    if is_pattern(key) and any(fnmatch.fnmatchcase(n, key) for n in [*static, *templates]):
        return True
    tokens = _glob_tokens(key) if is_pattern(key) else tuple(("lit", c) for c in key)
    return any(_overlap(tokens, _template_tokens(t)) for t in templates)
