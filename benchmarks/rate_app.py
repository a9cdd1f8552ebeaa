"""The Celery app that ``benchmarks/rate.py`` runs in real ``celery worker`` subprocesses.

    celery -A benchmarks.rate_app worker -P prefork -c 4 -Q <queue> ...

Configured from environment variables, so each run of the script gets its own keys and queue:

* ``RATE_REDIS``: Redis for the semaphore and the bookkeeping (default
  ``redis://127.0.0.1:6379/0``); ``RATE_BROKER``: the broker (default: ``RATE_REDIS``);
* ``RATE_PREFIX``: the first part of every key the run writes: semaphore keys, bookkeeping and,
  on a Redis broker, kombu's own keys (``global_keyprefix``), so they can be deleted by a SCAN
  of the prefix; ``RATE_QUEUE``: the queue (``task_default_queue``);
* ``RATE_WORKER_HOLD``: ``semaphore_worker_hold`` (default: the library's; ``0`` turns the
  worker-side gate off).

Tasks (explicit names, so the module may be imported under any name), every one with the same
body (``d`` seconds long):

* ``rate.plain(d)``: no limit at all (warm-up, and how fast the nodes start tasks unhindered);
* ``rate.limited(d)``: ``@limited("bench-rate", limit=HIGH_LIMIT, rate=RATE)``: the rate is
  the constraint, for the whole cluster;
* ``rate.celery(d)``: Celery's own ``rate_limit=RATE``, which every worker applies on its own;
* ``rate.both(d)``: ``@limited("bench-rate-both", limit=BOTH_LIMIT, rate=RATE)``: with long
  enough bodies the units are the constraint, and the rate must still hold.

Every body records itself, independently of any semaphore and of Celery's rate limiting: on
entry one script increments ``<prefix>:inside:<kind>`` and keeps the maximum in
``<prefix>:max:<kind>``; on exit one script decrements it and appends
``"<start> <end> <node>"`` to the ledger ``<prefix>:ledger:<kind>`` (``time.time()`` read by
the body itself: all workers run on the benchmark's host).  The body sleeps until ``start + d``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery

from celery_semaphore import limited, throttled

__all__ = [
    "BOTH",
    "BOTH_NAME",
    "BOTH_LIMIT",
    "CELERY",
    "HIGH_LIMIT",
    "KINDS",
    "LIMITED",
    "LIMITED_NAME",
    "PLAIN",
    "RATE",
    "RATE_PER_SECOND",
    "AppConfig",
    "make_app",
]

PLAIN = "rate.plain"
LIMITED = "rate.limited"
CELERY = "rate.celery"
BOTH = "rate.both"
#: the ledger kind each task records under
KINDS = {PLAIN: "plain", LIMITED: "limited", CELERY: "celery", BOTH: "both"}
#: the configured rate of every rate-limited task: RATE_PER_SECOND starts per second
RATE_PER_SECOND = 20
RATE = f"{RATE_PER_SECOND}/s"
#: the semaphores' names
LIMITED_NAME = "bench-rate"
BOTH_NAME = "bench-rate-both"
#: units of ``rate.limited``: more than the nodes have slots, so only the rate holds it back
HIGH_LIMIT = 64
#: units of ``rate.both``: with 200 ms bodies 2 units admit 10 starts/s, below RATE
BOTH_LIMIT = 2


@dataclass(frozen=True)
class AppConfig:
    redis_url: str = "redis://127.0.0.1:6379/0"
    broker_url: str = ""
    prefix: str = "bench-rate"
    queue: str = "bench-rate-q"
    worker_hold: int | None = None  # semaphore_worker_hold; None: the library's default

    @property
    def broker(self) -> str:
        return self.broker_url or self.redis_url

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> AppConfig:
        env = dict(os.environ if environ is None else environ)
        redis_url = env.get("RATE_REDIS", cls.redis_url)
        return cls(
            redis_url=redis_url,
            broker_url=env.get("RATE_BROKER", "") or redis_url,
            prefix=env.get("RATE_PREFIX", cls.prefix),
            queue=env.get("RATE_QUEUE", cls.queue),
            worker_hold=int(env["RATE_WORKER_HOLD"]) if env.get("RATE_WORKER_HOLD") else None,
        )

    def environ(self) -> dict[str, str]:
        """The variables that make a worker's ``from_env()`` equal to this config."""
        return {
            "RATE_REDIS": self.redis_url,
            "RATE_BROKER": self.broker,
            "RATE_PREFIX": self.prefix,
            "RATE_QUEUE": self.queue,
            "RATE_WORKER_HOLD": "" if self.worker_hold is None else str(self.worker_hold),
        }

    def key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))


def make_app(cfg: AppConfig, main: str = "rate") -> Any:
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
    )
    if cfg.worker_hold is not None:
        app.conf.semaphore_worker_hold = cfg.worker_hold
    return app


CFG = AppConfig.from_env()
app = make_app(CFG)

# -- bookkeeping (independent of any semaphore and of Celery's rate limiting) ----------------

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


def body(kind: str, seconds: float, node: str) -> None:
    """The measured body: its own start (read first), ``seconds`` long; ``node``: the worker
    that ran it."""
    start = time.time()
    r = client()
    r.eval(ENTER, 2, CFG.key("inside", kind), CFG.key("max", kind))
    time.sleep(max(0.0, start + seconds - time.time()))
    end = time.time()
    entry = f"{start:.6f} {end:.6f} {node}"
    r.eval(LEAVE, 2, CFG.key("inside", kind), CFG.key("ledger", kind), entry)


# -- the tasks -------------------------------------------------------------------------------


def _node(task: Any) -> str:
    return str(task.request.hostname or "-").split("@")[0]


@app.task(name=PLAIN)  # type: ignore[untyped-decorator]
def plain(d: float) -> None:
    body(KINDS[PLAIN], d, _node(plain))


@app.task(name=LIMITED)  # type: ignore[untyped-decorator]
@limited(LIMITED_NAME, limit=HIGH_LIMIT, rate=RATE)
def limited_task(d: float) -> None:
    body(KINDS[LIMITED], d, _node(limited_task))


@app.task(name=CELERY, rate_limit=RATE)  # type: ignore[untyped-decorator]
def celery_rate_limited(d: float) -> None:
    body(KINDS[CELERY], d, _node(celery_rate_limited))


@app.task(name=BOTH)  # type: ignore[untyped-decorator]
@limited(BOTH_NAME, limit=BOTH_LIMIT, rate=RATE)
def both(d: float) -> None:
    body(KINDS[BOTH], d, _node(both))


# -- the adaptive case: a fake downstream service that refuses above SERVICE_CAPACITY ------

SVC_FIXED = "rate.svc_fixed"
SVC_ADAPTIVE = "rate.svc_adaptive"
#: the semaphores' names, and their limit: well above what the service takes
SVC_FIXED_NAME = "bench-svc-fixed"
SVC_ADAPTIVE_NAME = "bench-svc-adaptive"
SVC_LIMIT = 40
#: calls the fake service serves at once; one more is refused (a 429)
SERVICE_CAPACITY = 20
#: what the service's 429 says (Retry-After, seconds)
SERVICE_RETRY_AFTER = 0.1

CALL = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(ARGV[1]) then
  redis.call('DECR', KEYS[1])
  redis.call('INCR', KEYS[2])
  return 0
end
if n > tonumber(redis.call('GET', KEYS[3]) or '0') then redis.call('SET', KEYS[3], n) end
return 1
"""


def call_service(kind: str, seconds: float) -> bool:
    """One call of ``seconds`` to the fake service: refused (False, counted in
    ``<prefix>:svc429:<kind>``) when SERVICE_CAPACITY calls are already in flight."""
    r = client()
    inflight = CFG.key("svcin", kind)
    ok = bool(
        r.eval(
            CALL, 3, inflight, CFG.key("svc429", kind), CFG.key("svcmax", kind), SERVICE_CAPACITY
        )
    )
    if ok:
        time.sleep(seconds)
        r.decr(inflight)
    r.rpush(CFG.key("ledger", kind), f"{time.time():.6f} {int(ok)}")
    return ok


@app.task(name=SVC_FIXED)  # type: ignore[untyped-decorator]
@limited(SVC_FIXED_NAME, limit=SVC_LIMIT)
def svc_fixed(d: float) -> None:
    call_service("svc-fixed", d)


@app.task(name=SVC_ADAPTIVE)  # type: ignore[untyped-decorator]
@limited(SVC_ADAPTIVE_NAME, limit=SVC_LIMIT, adaptive=True)
def svc_adaptive(d: float) -> None:
    if not call_service("svc-adaptive", d):
        throttled(retry_after=SERVICE_RETRY_AFTER)
