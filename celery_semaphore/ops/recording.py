"""Check a limit from the outside: count the bodies of limited tasks that run at once, and
find permits nobody gave back.  The pytest plugin (``celery_semaphore.pytest``) is built on
this module; it works without pytest too::

    with BodyRecorder(app) as recorder:
        ...  # run tasks through a worker
        assert recorder.max_concurrency("api") <= 3
        assert recorder.no_permits_held()

**What is counted.**  :class:`BodyRecorder` wraps the *user's function* of every limited task
of the app: the code inside the permit, not the library's wrapper around it.  A body adds one
to a counter per semaphore when it starts and takes it off when it ends, and the highest value
seen is kept.  So the count is independent of the semaphore's own bookkeeping: a body that ran
without a permit (a bug, or ``semaphore_enabled = False``) is counted all the same, and a task
waiting for its permit in a worker slot is not counted at all.

Which semaphores a body counts under: every fixed name of its ``@limited`` or
:class:`~celery_semaphore.LimitedTask` (known from the code), and the names of the permit the
body holds (for names made from the task's arguments, ``"api:{customer_id}"``).  Units
(:meth:`~BodyRecorder.max_units`) are the permit's weights, else the code's.

**Where the counts live.**  In Redis, in the app's semaphore store under its
``semaphore_key_prefix`` (two keys, one hash tag), updated by one small Lua script per start
and per end.  So bodies are counted in every process that runs them: threads, a prefork pool's
children, the solo pool.  The wrapping is done in this process when the recorder starts (and,
for tasks registered later, when a task first runs here: Celery's ``task_prerun``), so it
covers workers embedded in the test process (Celery's ``start_worker``, any pool) and pool
processes forked from it after that; not ``celery worker`` processes started separately, which
import the tasks afresh.  Each start and end is recorded once per body (a token per body), so
redis-py retrying a command after a lost reply does not count a body twice.

Timeline of one body, and why the count can never exceed what really ran::

    worker: permit granted ──► [record start] ──► user's function ──► [record end] ──► release
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import CellType
from typing import Any

from ..core.semaphore import HolderInfo
from ..integration import config
from ..integration.body import current_permits
from ..integration.clients import client_for
from ..integration.decorators import spec_of
from ..integration.locks import member_permits
from ..integration.spec import LimitSpec
from . import registry, views

__all__ = ["BodyRecorder", "PermitCheck", "held_permits"]

# KEYS[1]  the counts hash: now:<name> bodies running, max:<name> the most at once,
#          units:<name> and maxunits:<name> the same in units, started:<name> bodies started
# KEYS[2]  the set of tokens of the bodies running now (a start or end is counted once)
# ARGV[1]  the body's token;  ARGV[2]  1 (the body starts) or -1 (it ended)
# ARGV[3..] pairs: semaphore name, units
# Returns 1 when counted, 0 when this token's start (or end) was counted already.
_RECORD = """
local counts, running = KEYS[1], KEYS[2]
local token, step = ARGV[1], tonumber(ARGV[2])
if step > 0 then
  if redis.call('SADD', running, token) == 0 then return 0 end
elseif redis.call('SREM', running, token) == 0 then
  return 0
end
for i = 3, #ARGV, 2 do
  local name, units = ARGV[i], tonumber(ARGV[i + 1])
  local now = redis.call('HINCRBY', counts, 'now:' .. name, step)
  local used = redis.call('HINCRBY', counts, 'units:' .. name, step * units)
  if step > 0 then
    redis.call('HINCRBY', counts, 'started:' .. name, 1)
    if now > tonumber(redis.call('HGET', counts, 'max:' .. name) or '0') then
      redis.call('HSET', counts, 'max:' .. name, now)
    end
    if used > tonumber(redis.call('HGET', counts, 'maxunits:' .. name) or '0') then
      redis.call('HSET', counts, 'maxunits:' .. name, used)
    end
  end
end
return 1
"""


class _RecordedBody:
    """Stands in for a limited task's function while a recorder runs: counts, then calls it."""

    def __init__(self, recorder: BodyRecorder, spec: LimitSpec, original: Callable[..., Any]):
        self.recorder = recorder
        self.spec = spec
        self.original = original

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        counted = self.recorder._targets(self.spec)
        token = uuid.uuid4().hex
        self.recorder._record(token, 1, counted)
        try:
            return self.original(*args, **kwargs)
        finally:
            self.recorder._record(token, -1, counted)


def _body_cell(task: Any) -> tuple[Callable[..., Any], CellType] | None:
    """The task's wrapper function and the closure cell through which it calls the user's
    function: the cell holding what ``functools.wraps`` recorded as ``__wrapped__``.  A task
    with ``autoretry_for`` has Celery's retrying ``run`` around ours: ours is ``_orig_run``."""
    for run in (getattr(task, "_orig_run", None), getattr(task, "run", None)):
        fn: Any = getattr(run, "__func__", run)
        wrapped = getattr(fn, "__wrapped__", None)
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if wrapped is not None and contents is wrapped:
                return fn, cell
            if isinstance(contents, _RecordedBody):
                return fn, cell
    return None


class BodyRecorder:
    """Counts the bodies of ``app``'s limited tasks that run at the same time, per semaphore.

    Use it as a context manager (or :meth:`start` / :meth:`stop`).  While it runs, the bodies
    of the app's limited tasks are wrapped (see the module docstring); :meth:`stop` puts them
    back and deletes the counts."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.prefix = str(app.conf.get("semaphore_key_prefix", "celery_semaphore"))
        tag = f"{{recorder-{uuid.uuid4().hex[:12]}}}"
        #: the counts hash and the running set (one hash tag: one cluster slot)
        self.keys = (f"{self.prefix}:{tag}:counts", f"{self.prefix}:{tag}:running")
        self._patched: dict[int, tuple[CellType, _RecordedBody]] = {}
        self._lock = threading.Lock()
        self._scripts: dict[int, Any] = {}
        self._started = False

    # -- running ----------------------------------------------------------------------------

    def start(self) -> BodyRecorder:
        """Wrap every limited task the app has now, and any it runs later in this process."""
        from celery import signals

        if self._started:
            return self
        self._started = True
        for task in list(self.app.tasks.values()):
            self.instrument(task)
        signals.task_prerun.connect(self._on_prerun, weak=False)
        return self

    def stop(self) -> None:
        """Put the tasks' functions back, and delete the counts from Redis."""
        from celery import signals

        if not self._started:
            return
        self._started = False
        signals.task_prerun.disconnect(self._on_prerun)
        with self._lock:
            patched, self._patched = self._patched, {}
        for cell, recorded in patched.values():
            if cell.cell_contents is recorded:
                cell.cell_contents = recorded.original
        self._client().delete(*self.keys)

    def __enter__(self) -> BodyRecorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def instrument(self, task: Any) -> bool:
        """Wrap the body of ``task`` (True), or do nothing for a task that is not limited
        (False).  Raises RuntimeError for a limited task whose body cannot be reached, or that
        another recorder wraps."""
        spec = spec_of(task)
        if spec is None:
            return False
        found = _body_cell(task)
        if found is None:
            raise RuntimeError(
                f"celery-semaphore: cannot record the bodies of task {task.name}: its run() "
                "is not the wrapper @limited or LimitedTask made (was it wrapped again?)"
            )
        fn, cell = found
        with self._lock:
            if id(fn) in self._patched:
                return True
            current = cell.cell_contents
            if isinstance(current, _RecordedBody):
                raise RuntimeError(
                    f"celery-semaphore: task {task.name} is already recorded by another "
                    "BodyRecorder; stop that one first"
                )
            recorded = _RecordedBody(self, spec, current)
            cell.cell_contents = recorded
            self._patched[id(fn)] = (cell, recorded)
        return True

    def _on_prerun(self, sender: Any = None, **_: Any) -> None:
        if sender is not None and getattr(sender, "app", None) is self.app:
            self.instrument(sender)

    # -- recording (in whichever process runs the body) -----------------------------------

    def _client(self) -> Any:
        return client_for(config.redis_url_for(self.app.conf), self.app.conf)

    def _record(self, token: str, step: int, counted: Mapping[str, int]) -> None:
        client = self._client()
        script = self._scripts.get(id(client))
        if script is None:
            script = self._scripts.setdefault(id(client), client.register_script(_RECORD))
        args: list[Any] = [token, step]
        for name, units in counted.items():
            args += [name, units]
        script(keys=list(self.keys), args=args)

    @staticmethod
    def _targets(spec: LimitSpec) -> dict[str, int]:
        """Semaphore name -> units, for the body about to run in this thread."""
        out: dict[str, int] = {}
        static = {m.name for m in spec.members if not m.dynamic_name}
        dynamic = any(m.dynamic_name for m in spec.members)
        permits = current_permits()
        if permits:  # the innermost body's permit is the last one taken in this thread
            members = member_permits(permits[-1])
            names = {p.semaphore.name for p in members}
            if dynamic or names <= static:
                out.update((p.semaphore.name, p.weight) for p in members)
        for member in spec.members:
            if not member.dynamic_name:
                out.setdefault(member.name, member.weight)
        return out

    # -- what was seen ------------------------------------------------------------------------

    def _counts(self) -> dict[str, int]:
        raw = self._client().hgetall(self.keys[0])
        return {_text(k): int(v) for k, v in raw.items()}

    def _field(self, kind: str, name: str) -> int:
        value = self._client().hget(self.keys[0], f"{kind}:{name}")
        return int(value) if value is not None else 0

    def max_concurrency(self, name: str) -> int:
        """The most bodies of tasks under semaphore ``name`` that ran at the same time."""
        return self._field("max", name)

    def max_units(self, name: str) -> int:
        """The most units of ``name`` (the sum of the weights) that running bodies took at
        the same time."""
        return self._field("maxunits", name)

    def bodies(self, name: str) -> int:
        """How many bodies under ``name`` started while the recorder ran."""
        return self._field("started", name)

    def running(self, name: str) -> int:
        """How many bodies under ``name`` run right now."""
        return self._field("now", name)

    def names(self) -> list[str]:
        """The semaphores some body ran under, sorted."""
        return sorted(k.partition(":")[2] for k in self._counts() if k.startswith("started:"))

    def clear(self) -> None:
        """Forget every count (bodies running now still count down when they end)."""
        self._client().delete(self.keys[0])

    def no_permits_held(self, timeout: float = 5.0) -> PermitCheck:
        """Wait up to ``timeout`` seconds for every permit of the app's semaphores (and those
        the bodies ran under) to be given back; see :func:`held_permits`."""
        return held_permits(self.app, timeout=timeout, names=self.names())


@dataclass
class PermitCheck:
    """What :func:`held_permits` found: true when no permit is held.  ``held`` maps each
    semaphore with holders to them (:class:`~celery_semaphore.HolderInfo`), ``checked`` names
    the semaphores looked at.  Its ``repr`` lists the holders, so ``assert check`` shows them
    when it fails."""

    held: dict[str, list[HolderInfo]] = field(default_factory=dict)
    checked: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return not self.held

    def __repr__(self) -> str:
        if not self.held:
            return f"<no permits held; checked {self.checked!r}>"
        parts = [
            f"{name!r}: " + ", ".join(f"{h.token} (weight {h.weight})" for h in holders)
            for name, holders in sorted(self.held.items())
        ]
        return f"<permits still held: {'; '.join(parts)}>"


def held_permits(
    app: Any, *, timeout: float = 0.0, names: Iterable[str] = (), interval: float = 0.05
) -> PermitCheck:
    """The permits still held of the semaphores under ``app``'s ``semaphore_key_prefix``: the
    app's limited tasks' semaphores, those in the registry and in Redis (a SCAN), and
    ``names``.  Looks again every ``interval`` seconds until none is held or ``timeout``
    seconds have passed (a worker gives permits back just after the bodies end)."""
    conf = app.conf
    client = client_for(config.redis_url_for(conf), conf)
    prefix = str(conf.get("semaphore_key_prefix", "celery_semaphore"))
    hash_tag = conf.get("semaphore_hash_tag", None)
    known = registry.known(client, prefix, app, scan=True)
    for name in names:
        known.setdefault(name, registry.Known(name))
    semaphores = [views.semaphore_for_known(client, prefix, e, hash_tag) for e in known.values()]
    deadline = time.monotonic() + max(timeout, 0.0)
    while True:
        held = {}
        for sem in semaphores:
            holders = sem.inspect().holders
            if holders:
                held[sem.name] = holders
        if not held or time.monotonic() >= deadline:
            return PermitCheck(held, sorted(known))
        time.sleep(interval)


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
