"""The Celery app that ``benchmarks/e2e.py`` runs in real ``celery worker`` subprocesses.

    celery -A benchmarks.e2e_app worker -P threads -c 16 -Q <queue> ...

Configured from environment variables, so each measured run gets its own keys and queue:

* ``E2E_REDIS``: Redis for the semaphore and the bookkeeping (default
  ``redis://127.0.0.1:6379/0``); ``E2E_BROKER``: the broker (default: ``E2E_REDIS``);
* ``E2E_PREFIX``: the first part of every key this run writes: semaphore keys, bookkeeping
  and, on a Redis broker, kombu's own keys (``global_keyprefix``), so the run's keys can be
  deleted by a SCAN of the prefix;
* ``E2E_QUEUE``: the queue (``task_default_queue``); ``E2E_LIMIT``: the limit (default 8);
* ``E2E_CONF``: a JSON dict of extra ``app.conf`` settings (e.g. ``semaphore_wait_timeout``);
* ``E2E_PROFILE``: a directory: profile every thread of every worker process with cProfile
  (for ``benchmarks/e2e_profile.py``); the data is cleared when the file ``reset`` in it
  changes, and each process writes ``<pid>-<role>.prof`` there when ``dump`` changes;
* ``E2E_SEM_LOG``: the level of the ``celery_semaphore`` loggers (default ``INFO``).

Tasks (explicit names, so the module may be imported under any name):

* ``e2e.plain(d)``: no semaphore (the dedicated-queue baseline, and the "unlimited" tasks);
* ``e2e.limited(d)``: ``@limited("bench", limit=LIMIT)``, library defaults;
* ``e2e.bare(d)``: no Celery layer: the body acquires (without blocking) and releases a core
  :class:`~celery_semaphore.Semaphore` of limit LIMIT around itself, the two round trips any
  Redis-backed limit makes per task (a run gives it a limit that never binds);
* ``e2e.handrolled(d)``: the hand-rolled baseline: a Redis ZSET semaphore (one Lua script
  takes a slot if fewer than LIMIT are taken), else ``self.retry(countdown=1,
  max_retries=None)``.

Every body records itself, independently of any semaphore: on entry one script increments
``<prefix>:inside:<kind>`` and keeps the maximum in ``<prefix>:max:<kind>``; on exit one
script decrements it and appends ``"<start> <end> <inside at entry> <how> <task id>"`` to the
ledger ``<prefix>:ledger:<kind>`` (``time.time()``: all workers run on the benchmark's host).
The body sleeps until ``start + d``, so the bookkeeping round trip is inside the body's ``d``.
"""

from __future__ import annotations

import cProfile
import json
import logging
import os
import pstats
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import redis
from celery import Celery, signals

from celery_semaphore import Semaphore, limited
from celery_semaphore.integration.delivery import Directive
from celery_semaphore.integration.wait_state import WaitState

__all__ = [
    "BARE",
    "HANDROLLED",
    "LIMITED",
    "PLAIN",
    "AppConfig",
    "make_app",
]

PLAIN = "e2e.plain"
LIMITED = "e2e.limited"
HANDROLLED = "e2e.handrolled"
BARE = "e2e.bare"
#: the ledger kind each task records under
KINDS = {PLAIN: "plain", LIMITED: "limited", HANDROLLED: "handrolled", BARE: "bare"}
SEMAPHORE_NAME = "bench"
#: the hand-rolled baseline's retry countdown, as in the issue
HAND_COUNTDOWN = 1.0
#: seconds a hand-rolled slot lives if its holder vanishes (a typical hand-rolled "lease")
HAND_TTL = 60.0


@dataclass(frozen=True)
class AppConfig:
    redis_url: str = "redis://127.0.0.1:6379/0"
    broker_url: str = ""
    prefix: str = "e2e"
    queue: str = "e2e-q"
    limit: int = 8
    conf: dict[str, Any] = field(default_factory=dict)

    @property
    def broker(self) -> str:
        return self.broker_url or self.redis_url

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> AppConfig:
        env = dict(os.environ if environ is None else environ)
        redis_url = env.get("E2E_REDIS", cls.redis_url)
        return cls(
            redis_url=redis_url,
            broker_url=env.get("E2E_BROKER", "") or redis_url,
            prefix=env.get("E2E_PREFIX", cls.prefix),
            queue=env.get("E2E_QUEUE", cls.queue),
            limit=int(env.get("E2E_LIMIT", str(cls.limit))),
            conf=dict(json.loads(env.get("E2E_CONF", "{}") or "{}")),
        )

    def environ(self) -> dict[str, str]:
        """The variables that make a worker's ``from_env()`` equal to this config."""
        return {
            "E2E_REDIS": self.redis_url,
            "E2E_BROKER": self.broker,
            "E2E_PREFIX": self.prefix,
            "E2E_QUEUE": self.queue,
            "E2E_LIMIT": str(self.limit),
            "E2E_CONF": json.dumps(self.conf),
        }

    def key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))


def make_app(cfg: AppConfig, main: str = "e2e") -> Any:
    """A Celery app for ``cfg`` (no tasks): the workers' app, and the parent's client."""
    app = Celery(main, broker=cfg.broker)
    transport: dict[str, Any] = {}
    if cfg.broker.startswith(("redis://", "rediss://", "unix://")):
        transport["global_keyprefix"] = cfg.key("kombu", "")
    app.conf.update(
        semaphore_redis_url=cfg.redis_url,
        semaphore_key_prefix=cfg.key("sem"),
        task_default_queue=cfg.queue,
        task_ignore_result=True,
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        **cfg.conf,
    )
    return app


CFG = AppConfig.from_env()
app = make_app(CFG)


def _semaphore_logs_at_info(**_: Any) -> None:
    """Workers run at ``-l WARNING`` (no per-task lines); the library's park/wake lines
    (loggers ``celery_semaphore.*``, INFO) are kept for the analysis."""
    logging.getLogger("celery_semaphore").setLevel(os.environ.get("E2E_SEM_LOG", "INFO"))


signals.after_setup_logger.connect(_semaphore_logs_at_info, weak=False)

# -- profiling (E2E_PROFILE only) -------------------------------------------------------------

PROFILE_DIR = os.environ.get("E2E_PROFILE", "")
_profiles: list[cProfile.Profile] = []
_profiles_lock = threading.Lock()


def _profile_this_thread(*_: Any) -> None:
    """A new thread's first profile event: give it its own cProfile profiler."""
    sys.setprofile(None)
    prof = cProfile.Profile(time.thread_time)  # CPU time of this thread, not wall time
    with _profiles_lock:
        _profiles.append(prof)
    prof.enable()


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime_ns / 1e9
    except OSError:
        return 0.0


def _profile_control(role: str) -> None:
    """Clear this process's profiles when ``reset`` changes, dump them when ``dump`` does."""
    reset, dump = os.path.join(PROFILE_DIR, "reset"), os.path.join(PROFILE_DIR, "dump")
    seen = {reset: _mtime(reset), dump: _mtime(dump)}
    for _ in range(100_000):  # bounded: 50 ms polls, about 80 minutes
        time.sleep(0.05)
        if _mtime(reset) != seen[reset]:
            seen[reset] = _mtime(reset)
            with _profiles_lock:
                for prof in _profiles:
                    prof.clear()
        if _mtime(dump) != seen[dump]:
            seen[dump] = _mtime(dump)
            with _profiles_lock:
                profs = list(_profiles)
            stats: pstats.Stats | None = None
            for prof in profs:
                try:  # a snapshot; a thread that ran nothing since the reset has none
                    if stats is None:
                        stats = pstats.Stats(prof)
                    else:
                        stats.add(prof)
                except TypeError:
                    continue
            if stats is not None:
                out = os.path.join(PROFILE_DIR, f"{os.getpid()}-{role}.prof")
                stats.dump_stats(out + ".tmp")
                os.replace(out + ".tmp", out)


def start_profiling(role: str) -> None:
    """Profile this thread and every thread started from now on, in this process."""
    with _profiles_lock:
        _profiles.clear()
    threading.setprofile(_profile_this_thread)
    _profile_this_thread()
    control = threading.Thread(
        target=_profile_control, args=(role,), name="e2e-profile", daemon=True
    )
    control.start()


if PROFILE_DIR:
    start_profiling("main")

    def _child_profiling(**_: Any) -> None:
        start_profiling("child")

    signals.worker_process_init.connect(_child_profiling, weak=False)

# -- bookkeeping (independent of any semaphore) ---------------------------------------------

ENTER = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
return n
"""

LEAVE = """
redis.call('DECR', KEYS[1])
redis.call('RPUSH', KEYS[2], ARGV[1])
return 1
"""

_clients: dict[int, redis.Redis] = {}


def client() -> redis.Redis:
    """One client (a thread-safe connection pool) per process."""
    pid = os.getpid()
    found = _clients.get(pid)
    if found is None:
        found = _clients[pid] = redis.Redis.from_url(CFG.redis_url)
    return found


def body(kind: str, seconds: float, how: str = "-", task_id: str = "-") -> None:
    """The measured body: ``seconds`` long from its recorded start to its recorded end.
    ``how`` is recorded too: for ``e2e.limited``, ``p`` when this copy of the task had parked
    (it came back by a wake-up or its countdown), ``s`` when the gate sent it ahead to stand by
    in its slot (see ``semaphore_worker_standby``), ``d`` when it ran on first delivery
    otherwise."""
    r = client()
    start = time.time()
    n = int(r.eval(ENTER, 2, CFG.key("inside", kind), CFG.key("max", kind)))
    time.sleep(max(0.0, start + seconds - time.time()))
    end = time.time()
    r.eval(
        LEAVE,
        2,
        CFG.key("inside", kind),
        CFG.key("ledger", kind),
        f"{start:.6f} {end:.6f} {n} {how} {task_id}",
    )


# -- the tasks -------------------------------------------------------------------------------


@app.task(name=PLAIN)  # type: ignore[untyped-decorator]
def plain(d: float) -> None:
    body(KINDS[PLAIN], d, task_id=str(plain.request.id))


@app.task(bind=True, name=LIMITED)  # type: ignore[untyped-decorator]
@limited(SEMAPHORE_NAME, limit=CFG.limit)
def limited_task(self: Any, d: float) -> None:
    parked = WaitState.from_request(self.request).epoch > 0
    directive = Directive.from_request(self.request)
    stood_by = directive is not None and directive.do == "standby"
    body(KINDS[LIMITED], d, "p" if parked else "s" if stood_by else "d", str(self.request.id))


_semaphores: dict[int, Semaphore] = {}


@app.task(name=BARE)  # type: ignore[untyped-decorator]
def bare(d: float) -> None:
    pid = os.getpid()
    sem = _semaphores.get(pid)
    if sem is None:
        sem = _semaphores[pid] = Semaphore(
            "bench-bare", CFG.limit, redis=client(), key_prefix=CFG.key("sem")
        )
    task_id = str(bare.request.id)
    permit = sem.acquire(blocking=False)
    if permit is None:  # the run's limit is above the tasks in flight: a refusal is a bug
        raise RuntimeError(f"e2e.bare: semaphore {sem.name!r} (limit {sem.limit}) refused")
    try:
        body(KINDS[BARE], d, task_id=task_id)
    finally:
        permit.release()


# The hand-rolled baseline: what people write before reaching for a library.  A ZSET of slot
# holders scored by expiry (client clock); taking a slot is atomic (one script), so it never
# exceeds the limit; a refused task retries after HAND_COUNTDOWN seconds, for ever.
HAND_TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
  return 1
end
return 0
"""


@app.task(bind=True, name=HANDROLLED, max_retries=None)  # type: ignore[untyped-decorator]
def handrolled(self: Any, d: float) -> None:
    r = client()
    token = f"{self.request.id}:{uuid.uuid4().hex}"
    now = time.time()
    key = CFG.key("hand", "slots")
    took = r.eval(HAND_TAKE, 1, key, now, now + HAND_TTL, CFG.limit, token)
    if not int(took):
        r.incr(CFG.key("hand", "retries"))
        raise self.retry(countdown=HAND_COUNTDOWN, max_retries=None)
    try:
        body(KINDS[HANDROLLED], d, task_id=str(self.request.id))
    finally:
        r.zrem(key, token)
