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

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .patterns import Lookup

__all__ = ["DEFAULT", "PerCall"]

#: the entry of a table that matches every name (its default)
DEFAULT = "*"


@dataclass(frozen=True)
class PerCall:
    """A value one call of the task decides: ``value(arguments, name)`` gives what the user's
    callable returned, or the table's entry for the concrete name (a
    :class:`~celery_semaphore.integration.patterns.Lookup`: exact name, then the most specific
    pattern), unchecked."""

    #: how errors show where the value came from: ``tier_limit`` or ``<table of 3: ...>``
    shown: str
    fn: Callable[[Mapping[str, Any]], Any] | None = None
    table: Lookup[Any] | None = None

    @property
    def uses_arguments(self) -> bool:
        return self.fn is not None

    def value(self, arguments: Mapping[str, Any], name: str) -> Any:
        if self.fn is not None:
            return self.fn(arguments)
        assert self.table is not None
        return self.table.first((name,))
