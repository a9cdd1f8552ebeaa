"""A limit or rate per key: ``limit=`` and ``rate=`` of a task whose semaphore name is a
template (``"llm:{customer_id}"``) may differ from one concrete name to another.

Either a callable of the call's bound arguments (``limit=lambda a: TIERS[a["tier"]]``), or a
table by concrete name: exact names and glob patterns (``*``, ``?``, ``[...]``), with ``"*"``
as the default every table must have::

    @limited("llm:{customer_id}", limit={"llm:acme": 50, "llm:trial-*": 2, "*": 5})

A name's entry is its exact one, else the most specific pattern that matches it: the one with
the most characters that are not wildcards (``"llm:trial-*"`` before ``"*"``), the first given
on a tie.  A table is looked up once per name and the answer cached.
"""

from __future__ import annotations

import fnmatch
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = ["DEFAULT", "KeyTable", "PerCall", "is_pattern", "specificity"]

_T = TypeVar("_T")

#: the entry of a table that matches every name (its default)
DEFAULT = "*"
#: names whose entry a table remembers
_CACHE = 4096

_WILD = re.compile(r"[*?\[]")


def is_pattern(key: str) -> bool:
    """Does ``key`` hold a glob wildcard (``*``, ``?`` or ``[``)?"""
    return _WILD.search(key) is not None


def specificity(pattern: str) -> int:
    """How specific a glob pattern is: its characters outside wildcards and brackets."""
    return len(re.sub(r"\[[^\]]*\]|[*?]", "", pattern))


@dataclass(eq=False)
class KeyTable(Generic[_T]):
    """Values by concrete semaphore name: exact names, then patterns, most specific first."""

    exact: Mapping[str, _T]
    #: (pattern, compiled, value), most specific first
    patterns: tuple[tuple[str, re.Pattern[str], _T], ...]
    _found: OrderedDict[str, _T] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def build(cls, table: Mapping[str, _T]) -> KeyTable[_T]:
        """The table of ``table`` (keys already checked to be non-empty strs)."""
        exact = {k: v for k, v in table.items() if not is_pattern(k)}
        ordered = sorted(
            ((i, k, v) for i, (k, v) in enumerate(table.items()) if is_pattern(k)),
            key=lambda row: (-specificity(row[1]), row[0]),
        )
        patterns = tuple((k, re.compile(fnmatch.translate(k)), v) for _, k, v in ordered)
        return cls(exact, patterns)

    def lookup(self, name: str) -> _T | None:
        """The entry for ``name``; None when nothing matches (a table without ``"*"``)."""
        if name in self.exact:
            return self.exact[name]
        with self._lock:
            if name in self._found:
                return self._found[name]
        for _, compiled, value in self.patterns:
            if compiled.match(name):
                with self._lock:
                    self._found[name] = value
                    while len(self._found) > _CACHE:
                        self._found.popitem(last=False)
                return value
        return None

    def __repr__(self) -> str:
        keys = [*self.exact, *(p for p, _, _ in self.patterns)]
        more = ", ..." if len(keys) > 4 else ""
        return f"<table of {len(keys)}: {', '.join(map(repr, keys[:4]))}{more}>"


@dataclass(frozen=True)
class PerCall:
    """A value one call of the task decides: ``value(arguments, name)`` gives what the user's
    callable returned, or the table's entry for the concrete name, unchecked."""

    #: how errors show where the value came from: ``<tier_limit>`` or ``<table of 3: ...>``
    shown: str
    fn: Callable[[Mapping[str, Any]], Any] | None = None
    table: KeyTable[Any] | None = None

    @property
    def uses_arguments(self) -> bool:
        return self.fn is not None

    def value(self, arguments: Mapping[str, Any], name: str) -> Any:
        if self.fn is not None:
            return self.fn(arguments)
        assert self.table is not None
        return self.table.lookup(name)
