"""Which semaphores exist, which tasks use them, and where each one's limit comes from.

Three sources, merged by :func:`known`:

1. the app itself: every task made with ``@limited`` or ``LimitedTask`` (the code limit and
   weight), and ``semaphore_limits`` from its configuration; a name made from the task's
   arguments (``"api:{customer_id}"``) is not a semaphore until a call names one, so those
   are recorded as they are used (:func:`note_used`: once per name and process);
2. the registry hash in Redis, written by every worker at start (:func:`record`), so the
   CLI and metrics see the semaphores of workers whose code the reader has not imported;
3. discovery: a ``SCAN`` for semaphore state keys under the prefix (only for operator tools,
   never on a worker's hot path), which also finds semaphores used without Celery.

Registry key layout (one hash per key prefix, outside every semaphore's hash tag)::

    <prefix>:registry   HASH  <semaphore name> -> JSON {
                                  "tasks": {<task name>: {"limit": int, "weight": int}},
                                  "template": str,         # only for a dynamic name
                                  "setting": int | null,   # semaphore_limits[name] there
                                  "node": str,             # the worker that wrote it last
                                  "at": float}             # when (epoch seconds)

    {<prefix>:registry}:used  ZSET  <dynamic name> -> when a worker last noted its use
                                  (epoch seconds; in the registry's Redis Cluster slot)

A worker merges its tasks into the entry (a WATCH/MULTI transaction), so workers running
different task modules add up.  An entry stays until ``celery semaphore reset NAME --forget``,
except a dynamic name's: a worker notes its use again at most every :func:`refresh_every`
seconds, and one unused for ``semaphore_registry_forget_after`` seconds (default
:data:`FORGET_AFTER`) is forgotten (:func:`prune`, which workers run now and then) and no
longer listed meanwhile (:func:`read` with ``forget_after``).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from ..core.keys import encode_name

__all__ = [
    "FORGET_AFTER",
    "Known",
    "TaskUse",
    "app_limits",
    "app_uses",
    "discover",
    "forget",
    "forget_after",
    "known",
    "note_used",
    "page",
    "prune",
    "read",
    "record",
    "refresh_every",
    "registry_key",
    "used_key",
]

#: how many keys one SCAN call asks for
SCAN_COUNT = 1000
#: seconds after its last use that a dynamic name is forgotten (semaphore_registry_forget_after)
FORGET_AFTER = 7 * 24 * 3600.0
#: the most seconds between two notes of a dynamic name's use by one process
REFRESH_MAX = 3600.0
#: seconds between two prunes by one process
PRUNE_EVERY = 60.0
#: the most names one prune forgets (the next prune goes on)
PRUNE_BATCH = 1000


def registry_key(prefix: str) -> str:
    return f"{prefix}:registry"


def used_key(prefix: str) -> str:
    """When each dynamic name was last used; its hash tag is the registry's key, so both are
    in one Redis Cluster slot (a prefix has no braces)."""
    return f"{{{registry_key(prefix)}}}:used"


def forget_after(app: Any) -> float | None:
    """``semaphore_registry_forget_after`` of ``app`` (validated), None: never."""
    from ..integration.config import APP_SETTINGS, setting

    key = "semaphore_registry_forget_after"
    value = APP_SETTINGS[key][1](key, setting(app.conf, key, FORGET_AFTER))
    return None if value is None else float(value)


def refresh_every(ttl: float | None) -> float:
    """Seconds between two notes of one dynamic name's use by one process: a tenth of the
    time after which it is forgotten, at most :data:`REFRESH_MAX`."""
    return REFRESH_MAX if ttl is None else min(REFRESH_MAX, ttl / 10)


@dataclass(frozen=True)
class TaskUse:
    """One task limited by a semaphore, as its code declares it."""

    semaphore: str
    task: str
    limit: int
    weight: int = 1
    #: the name template a dynamic name was made from (None for a fixed name)
    template: str | None = None


@dataclass
class Known:
    """One known semaphore and the limits configured for it (the runtime override is in its
    Redis state: see :class:`~celery_semaphore.Snapshot`)."""

    name: str
    #: task name -> (code limit, weight)
    tasks: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: ``semaphore_limits[name]``, from the app, else as a worker recorded it
    setting: int | None = None
    #: the worker that recorded it last, and when (epoch seconds)
    node: str | None = None
    recorded_at: float | None = None
    #: where it was found: "app", "registry", "redis"
    found_in: set[str] = field(default_factory=set)
    #: the name template a dynamic name was made from, as a worker recorded it
    template: str | None = None

    @property
    def code_limits(self) -> list[int]:
        return sorted({limit for limit, _ in self.tasks.values()})

    @property
    def configured_limit(self) -> int | None:
        """The limit the workers use when no runtime override is set: ``semaphore_limits``,
        else the code's (the largest, if tasks sharing the name declare different ones)."""
        if self.setting is not None:
            return self.setting
        limits = self.code_limits
        return limits[-1] if limits else None

    @property
    def configured_source(self) -> str:
        if self.setting is not None:
            return "setting"
        return "code" if self.tasks else "unknown"


# -- the app's own view -----------------------------------------------------------------------


def app_uses(app: Any) -> list[TaskUse]:
    """The limited tasks the app has registered (after importing its task modules)."""
    from ..integration.decorators import spec_of

    # an operator tool still works from the registry when a task module fails to import
    with contextlib.suppress(Exception):
        app.loader.import_default_modules()
    uses = []
    for task_name, task in sorted(dict(app.tasks).items()):
        spec = spec_of(task)
        for member in spec.members if spec is not None else ():
            if not member.dynamic_name:  # a template names no semaphore by itself
                uses.append(TaskUse(member.name, task_name, member.limit, member.weight))
    return uses


def app_limits(app: Any) -> dict[str, int]:
    """``semaphore_limits`` of the app (validated), or an empty dict; with, for each fixed
    name of the app's tasks that a pattern key covers, the limit that pattern gives it."""
    from ..integration.config import APP_SETTINGS, configured_limit

    check = APP_SETTINGS["semaphore_limits"][1]
    limits = dict(check("semaphore_limits", app.conf.get("semaphore_limits", None)) or {})
    if limits:
        for use in app_uses(app):
            found = configured_limit(app.conf, use.semaphore)
            if found is not None:
                limits[use.semaphore] = found
    return limits


# -- the registry hash ------------------------------------------------------------------------


def record(
    client: Any,
    prefix: str,
    uses: Iterable[TaskUse],
    *,
    settings: Mapping[str, int] | None = None,
    node: str = "",
) -> list[str]:
    """Merge ``uses`` (and the ``semaphore_limits`` in force) into the registry; return the
    semaphore names written."""
    by_name: dict[str, list[TaskUse]] = {}
    for use in uses:
        by_name.setdefault(use.semaphore, []).append(use)
    key = registry_key(prefix)
    now = time.time()
    dynamic = {n: now for n, entries in by_name.items() if any(u.template for u in entries)}

    def merge(pipe: Any) -> None:
        current = pipe.hmget(key, list(by_name)) if by_name else []
        pipe.multi()
        for (name, entries), raw in zip(by_name.items(), current, strict=True):
            entry = _decode(raw)
            tasks = dict(entry.get("tasks") or {})
            for use in entries:
                tasks[use.task] = {"limit": use.limit, "weight": use.weight}
            value = {
                "tasks": tasks,
                "setting": (settings or {}).get(name),
                "node": node,
                "at": now,
            }
            template = next((u.template for u in entries if u.template), entry.get("template"))
            if template:
                value["template"] = template
            pipe.hset(key, name, json.dumps(value, sort_keys=True))
        if dynamic:
            pipe.zadd(used_key(prefix), dynamic)

    if by_name:
        client.transaction(merge, key)
    return sorted(by_name)


_noted_lock = threading.Lock()
#: (pid, prefix, name) -> when this process last noted the name's use (monotonic)
_noted: OrderedDict[tuple[int, str, str], float] = OrderedDict()
#: (pid, prefix) -> when this process last pruned the registry (monotonic)
_pruned: dict[tuple[int, str], float] = {}
#: names whose last note is remembered per process (the oldest is forgotten)
NOTED_MAX = 10_000


def note_used(
    client: Any,
    prefix: str,
    use: TaskUse,
    node: str = "",
    *,
    forget_after: float | None = FORGET_AFTER,
) -> bool:
    """Record a dynamic name this process uses (once per :func:`refresh_every` seconds per
    name: later calls return False at once), so an operator's ``celery semaphore list`` shows
    it, and forget names unused for ``forget_after`` seconds (a :func:`prune` at most every
    :data:`PRUNE_EVERY` seconds, or half ``forget_after``, per process)."""
    key = (os.getpid(), prefix, use.semaphore)
    now = time.monotonic()
    with _noted_lock:
        last = _noted.get(key)
        if last is not None and now - last < refresh_every(forget_after):
            return False
        _noted[key] = now
        _noted.move_to_end(key)
        while len(_noted) > NOTED_MAX:
            _noted.popitem(last=False)
        every = PRUNE_EVERY if forget_after is None else min(PRUNE_EVERY, forget_after / 2)
        due = forget_after is not None and now - _pruned.get(key[:2], -every) >= every
        if due:
            _pruned[key[:2]] = now
    record(client, prefix, [use], node=node)
    if due and forget_after is not None:
        prune(client, prefix, forget_after)
    return True


def prune(client: Any, prefix: str, forget_after: float, *, now: float | None = None) -> int:
    """Forget the dynamic names (up to :data:`PRUNE_BATCH`) that no worker used in the last
    ``forget_after`` seconds; returns how many.  A name noted meanwhile is kept (a
    transaction)."""
    key, used = registry_key(prefix), used_key(prefix)
    cutoff = (time.time() if now is None else now) - forget_after
    gone: list[str] = []

    def drop(pipe: Any) -> None:
        stale = pipe.zrangebyscore(used, "-inf", f"({cutoff}", start=0, num=PRUNE_BATCH)
        gone[:] = [_text(n) for n in stale]
        pipe.multi()
        if gone:
            pipe.hdel(key, *gone)
            pipe.zrem(used, *gone)

    client.transaction(drop, key, used)
    return len(gone)


def read(
    client: Any, prefix: str, *, forget_after: float | None = None, now: float | None = None
) -> dict[str, Known]:
    """The registry as :class:`Known` entries, by name; with ``forget_after``, without the
    dynamic names unused for that long (those a prune forgets)."""
    out: dict[str, Known] = {}
    stale: set[str] = set()
    if forget_after is not None:
        cutoff = (time.time() if now is None else now) - forget_after
        stale = {_text(n) for n in client.zrangebyscore(used_key(prefix), "-inf", f"({cutoff}")}
    for raw_name, raw in client.hgetall(registry_key(prefix)).items():
        name = _text(raw_name)
        if name in stale:
            continue
        entry = _decode(raw)
        tasks: dict[str, tuple[int, int]] = {}
        for task, use in (entry.get("tasks") or {}).items():
            if isinstance(use, Mapping) and isinstance(use.get("limit"), int):
                tasks[str(task)] = (int(use["limit"]), int(use.get("weight") or 1))
        setting = entry.get("setting")
        at = entry.get("at")
        template = entry.get("template")
        out[name] = Known(
            name,
            tasks,
            setting if isinstance(setting, int) else None,
            str(entry.get("node") or "") or None,
            float(at) if isinstance(at, (int, float)) else None,
            {"registry"},
            template if isinstance(template, str) and template else None,
        )
    return out


def forget(client: Any, prefix: str, name: str) -> bool:
    """Remove ``name`` from the registry; True if it was there."""
    found = bool(client.hdel(registry_key(prefix), name))
    client.zrem(used_key(prefix), name)
    return found


def page(
    entries: Mapping[str, Known], limit: int | None, after: str | None = None
) -> tuple[list[Known], bool]:
    """At most ``limit`` of ``entries`` (all with None), by name, from the first name after
    ``after``; and whether more follow."""
    names = sorted(entries)
    if after is not None:
        names = names[bisect.bisect_right(names, after) :]
    if limit is None or len(names) <= limit:
        return [entries[n] for n in names], False
    return [entries[n] for n in names[:limit]], True


# -- discovery --------------------------------------------------------------------------------


def discover(client: Any, prefix: str, hash_tag: str | None = None) -> set[str]:
    """Names of the semaphores with state in Redis under ``prefix`` (a SCAN: operator tools
    only), with their keys as ``semaphore_hash_tag`` lays them out: ``{name}`` without one,
    ``{hash_tag}:n:name`` with one.  Names too long to be readable in their key (hashed, see
    :mod:`.keys`) are left out unless another source knows them."""
    if hash_tag is None:
        head_text, pattern = f"{prefix}:{{", f"{_glob_escape(prefix)}:{{*}}:state"
        tail_text = "}:state"
    else:
        head_text = f"{prefix}:{{{encode_name(hash_tag)}}}:n:"
        pattern, tail_text = f"{_glob_escape(head_text)}*:state", ":state"
    head, tail = len(head_text), len(tail_text)
    names = set()
    for raw in client.scan_iter(match=pattern, count=SCAN_COUNT):
        encoded = _text(raw)[head:-tail]
        # a name's encoding quotes ":" and braces: anything else is another kind of key
        if "}" in encoded or "{" in encoded or "~" in encoded or ":" in encoded:
            continue
        names.add(unquote(encoded, encoding="utf-8", errors="strict"))
    return names


def known(
    client: Any, prefix: str, app: Any | None = None, *, scan: bool = True
) -> dict[str, Known]:
    """Every known semaphore, by name: from the app, the registry (without the dynamic names
    the app's ``semaphore_registry_forget_after`` forgets) and (``scan``) Redis."""
    out = read(client, prefix, forget_after=forget_after(app) if app is not None else None)
    if app is not None:
        for use in app_uses(app):
            entry = out.setdefault(use.semaphore, Known(use.semaphore))
            entry.tasks[use.task] = (use.limit, use.weight)
            entry.found_in.add("app")
    if scan:
        hash_tag = app.conf.get("semaphore_hash_tag", None) if app is not None else None
        for name in discover(client, prefix, hash_tag):
            out.setdefault(name, Known(name)).found_in.add("redis")
    if app is not None:
        from ..integration.config import configured_limit

        # semaphore_limits as this app reads it: the exact name, the template, a pattern
        for name, entry in out.items():
            limit = configured_limit(app.conf, name, entry.template)
            if limit is not None:
                entry.setting = limit
    return dict(sorted(out.items()))


def _decode(raw: Any) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)
