"""What the settings give, worked out once while they stay the same.

Celery's ``conf.get`` tries several spellings of a key through a chain of dicts (tens of
microseconds each), and a limited task reads about thirty settings on its way through the gate
and the body: on a 20 ms task that was a measurable share of a worker's CPU.  What is derived
from the settings is kept per ``conf`` object, keyed also by the identity of every value in
``conf.changes`` (where ``conf.update`` and ``conf.x = ...`` write), so a change made through
Celery's API is seen at once; ``config_from_object`` makes a new ``conf``.  (A value mutated in
place, e.g. ``conf.semaphore_limits["x"] = 3``, is not seen; assign a new dict.)  A plain
mapping (no ``changes``) is never memoised.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from . import renames

__all__ = ["memo", "setting"]

_T = TypeVar("_T")

_memo_lock = threading.Lock()
_memos: dict[int, tuple[weakref.ReferenceType[Any], tuple[int, ...], dict[Hashable, Any]]] = {}


def _generation(conf: Any) -> tuple[int, ...] | None:
    changes = getattr(conf, "changes", None)
    if not isinstance(changes, dict):
        return None
    return (len(changes), *map(id, changes.values()))


def memo(conf: Any, key: Hashable, compute: Callable[[], _T]) -> _T:
    """``compute()``, remembered for ``conf`` under ``key`` while its settings stay the same."""
    generation = _generation(conf)
    if generation is None:
        return compute()
    found = _memos.get(id(conf))
    if found is None or found[0]() is not conf or found[1] != generation:
        try:
            ref = weakref.ref(conf)
        except TypeError:
            return compute()
        found = (ref, generation, {})
        with _memo_lock:
            _memos[id(conf)] = found
            for dead in [k for k, v in _memos.items() if v[0]() is None]:
                del _memos[dead]
    table = found[2]
    try:
        return table[key]  # type: ignore[no-any-return]
    except KeyError:
        pass
    value = compute()
    table[key] = value
    return value


def setting(conf: Any, key: str, default: Any = None) -> Any:
    """``conf.get(key, default)``, memoised (see :func:`memo`); a renamed setting is also
    found under its old name (see :mod:`.renames`)."""
    return memo(conf, ("get", key, default), lambda: renames.lookup(conf, key, default)[1])
