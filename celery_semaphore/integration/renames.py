"""Renamed settings and task options: the old names keep working, with a warning.

Two options once had names that said little and looked like others:

* ``wait_timeout`` (``semaphore_wait_timeout``) is now ``slot_wait_timeout``: how long a task
  that waits for its permit *in a pool slot* waits there before it parks.  With the worker's
  gate (the default) those are the tasks the gate sends ahead to stand by; without it, a task
  near the head of the line.  It was easily taken for ``max_wait``, the whole wait.
* ``standby`` (``semaphore_standby``) is now ``slot_waiters``: how many waiters at the head of
  the line may wait in their slot when a task acquires there.  It looked like
  ``semaphore_worker_standby``, which is the gate's standby (a different thing).

An old name is read as the new one.  Given both, with different values, is an error naming
both.  The warning is a :class:`celery.exceptions.CDeprecationWarning`, as Celery's own for its
renamed settings, and is given where Celery gives those: when a worker starts, once its logging
is set up (Celery shows these warnings in the worker's log); a task option also warns when the
task is decorated.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Mapping
from typing import Any

from celery.exceptions import CDeprecationWarning

__all__ = [
    "RENAMED_OPTIONS",
    "RENAMED_SETTINGS",
    "lookup",
    "renamed_in",
    "task_options",
    "warn_renamed",
]

#: task options (``@limited(...)``; ``semaphore_<name>`` on a LimitedTask), old -> new
RENAMED_OPTIONS: dict[str, str] = {
    "wait_timeout": "slot_wait_timeout",
    "standby": "slot_waiters",
}

#: app settings, old -> new
RENAMED_SETTINGS: dict[str, str] = {
    f"semaphore_{old}": f"semaphore_{new}" for old, new in RENAMED_OPTIONS.items()
}

_OLD_OF = {new: old for old, new in RENAMED_SETTINGS.items()}
_MISSING = object()

#: task options given under an old name, seen at decoration: (where, old, new)
_option_uses: dict[tuple[str, str, str], None] = {}
_uses_lock = threading.Lock()


def lookup(conf: Any, key: str, default: Any) -> tuple[str, Any]:
    """The setting ``key`` from ``conf`` and the name it was given under: ``key`` itself,
    else its old name (see :data:`RENAMED_SETTINGS`), else ``default`` (under ``key``).
    Both names set to different values is a ValueError naming both."""
    old = _OLD_OF.get(key)
    value = conf.get(key, _MISSING)
    old_value = _MISSING if old is None else conf.get(old, _MISSING)
    if old is None or old_value is _MISSING:
        return key, default if value is _MISSING else value
    if value is _MISSING:
        return old, old_value
    if not _same(value, old_value):
        raise ValueError(
            f"{old}={old_value!r} and {key}={value!r} are both set: {old} is the old name of "
            f"{key}; set only {key}"
        )
    return key, value


def _same(a: object, b: object) -> bool:
    try:  # 1 and 1.0 are the same; True and 1 are not
        return isinstance(a, bool) == isinstance(b, bool) and bool(a == b)
    except Exception:  # a value whose == fails is not the same
        return False


def renamed_in(conf: Any) -> list[tuple[str, str]]:
    """The old setting names ``conf`` sets, each with its new name."""
    return [
        (old, new)
        for old, new in RENAMED_SETTINGS.items()
        if conf.get(old, _MISSING) is not _MISSING
    ]


def task_options(options: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """``options`` with every old option name replaced by its new one (a warning for each);
    an old and a new name given together with different values is a TypeError."""
    out = dict(options)
    for old, new in RENAMED_OPTIONS.items():
        if old not in out:
            continue
        value = out.pop(old)
        if new in out and not _same(out[new], value):
            raise TypeError(
                f"{where}: {old}={value!r} and {new}={out[new]!r} are both given: {old} is the "
                f"old name of {new}; give only {new}"
            )
        out.setdefault(new, value)
        with _uses_lock:
            _option_uses[(where, old, new)] = None
        warnings.warn(_option_warning(where, old, new), stacklevel=_caller_level())
    return out


def _option_warning(where: str, old: str, new: str) -> CDeprecationWarning:
    if where.startswith("LimitedTask"):
        what, use = f"attribute semaphore_{old}", f"semaphore_{new}"
    else:
        what, use = f"option {old}=", f"{new}="
    return CDeprecationWarning(
        f"{where}: the task {what} is deprecated and will be removed in a future version; "
        f"use {use} instead, it means the same"
    )


def _setting_warning(old: str, new: str) -> CDeprecationWarning:
    return CDeprecationWarning(
        f"The {old!r} setting is deprecated and will be removed in a future version; use "
        f"{new!r} instead, it means the same (see the renamed settings in the settings docs)"
    )


def warn_renamed(conf: Any) -> None:
    """Warn of each old setting name ``conf`` sets, and of each old task option name a task
    was decorated with in this process (a worker calls this once, at start)."""
    for old, new in renamed_in(conf):
        warnings.warn(_setting_warning(old, new), stacklevel=2)
    with _uses_lock:
        uses = list(_option_uses)
    for where, old, new in uses:
        warnings.warn(_option_warning(where, old, new), stacklevel=2)


def _caller_level() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside this package (the
    user's decorator or class), so that Python's filters attribute it to the user's code."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("celery_semaphore."):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level
