"""The Celery app the integration tests run in real worker subprocesses.

Configured from environment variables so each test (module) can point it at its own Redis
database, broker, queue and key prefix:

* ``CS_BROKER`` (default: the Redis URL), ``CS_REDIS`` (semaphores and test bookkeeping),
  ``CS_PREFIX`` (semaphore key prefix, also used for the bookkeeping keys), ``CS_QUEUE``;
* ``CS_LIMIT`` (default 2), ``CS_LEASE`` (default 60), ``CS_EXTRA`` (JSON dict of extra conf).

Bookkeeping is independent of the semaphore: every limited body increments ``<prefix>:inside``
on entry (tracking the maximum in ``<prefix>:max``), decrements it on exit, and appends its
task id to ``<prefix>:ran`` (the ledger).
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import redis
from celery import Celery
from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded

from celery_semaphore import LimitedTask, limited

REDIS = os.environ.get("CS_REDIS", "redis://127.0.0.1:6379/0")
PREFIX = os.environ.get("CS_PREFIX", "cstest")
QUEUE = os.environ.get("CS_QUEUE", "celery")
LIMIT = int(os.environ.get("CS_LIMIT", "2"))
LEASE = float(os.environ.get("CS_LEASE", "60"))

app = Celery("proj", broker=os.environ.get("CS_BROKER", REDIS), backend=REDIS)
app.conf.update(
    semaphore_redis_url=REDIS,
    semaphore_key_prefix=PREFIX,
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
# may override the above (e.g. semaphore_redis_url: a Redis Cluster, while the bookkeeping,
# broker and results stay on CS_REDIS)
app.conf.update(json.loads(os.environ.get("CS_EXTRA", "{}")))

_client: redis.Redis | None = None
_pid = -1

ENTER = """
local n = redis.call('INCRBY', KEYS[1], ARGV[2])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
redis.call('RPUSH', KEYS[3], ARGV[1])
return n
"""


def bookkeeping() -> redis.Redis:
    global _client, _pid
    if _client is None or _pid != os.getpid():
        _client, _pid = redis.Redis.from_url(REDIS), os.getpid()
    return _client


class Body:
    """Enter/leave bookkeeping around a limited body (an independent concurrency counter)."""

    def __init__(self, tag: str, name: str = "main", units: int = 1) -> None:
        self.tag, self.name, self.units = tag, name, units

    def __enter__(self) -> Body:
        r = bookkeeping()
        r.eval(
            ENTER,
            3,
            f"{PREFIX}:inside:{self.name}",
            f"{PREFIX}:max:{self.name}",
            f"{PREFIX}:ran",
            self.tag,
            self.units,
        )
        r.rpush(f"{PREFIX}:started", f"{self.tag}:{time.time()}")
        return self

    def __exit__(self, *exc: Any) -> None:
        bookkeeping().decrby(f"{PREFIX}:inside:{self.name}", self.units)
        bookkeeping().rpush(f"{PREFIX}:finished", f"{self.tag}:{time.time()}")


@app.task(bind=True)
@limited("main", limit=LIMIT, lease_ttl=LEASE)
def work(self: Any, tag: str, seconds: float = 0.05) -> str:
    with Body(tag):
        time.sleep(seconds)
    return tag


@app.task(bind=True)
@limited("main", limit=LIMIT, lease_ttl=LEASE)
def hog(self: Any, tag: str, n: int) -> str:
    """A body that holds the GIL of its process for a while: one long C call (``sum`` over a
    range never lets another thread of the process run until it returns)."""
    with Body(tag):
        sum(range(n))
    return tag


@app.task
@limited("main", limit=LIMIT, lease_ttl=LEASE)
def work_unbound(tag: str, seconds: float = 0.05) -> str:
    with Body(tag):
        time.sleep(seconds)
    return tag


@app.task(bind=True, max_retries=1, default_retry_delay=0.1)
@limited("main", limit=LIMIT, lease_ttl=LEASE)
def user_retry(self: Any, tag: str) -> str:
    with Body(f"{tag}:{self.request.retries}"):
        pass
    if self.request.retries == 0:
        raise self.retry(countdown=0.1)
    return f"{tag}:retries={self.request.retries}"


@app.task(bind=True)
@limited("main", limit=LIMIT, lease_ttl=LEASE)
def ignore_me(self: Any, tag: str) -> None:
    with Body(tag):
        pass
    raise Ignore()


@app.task(bind=True, acks_late=True)
@limited("main", limit=LIMIT, lease_ttl=LEASE)
def reject_me(self: Any, tag: str) -> None:
    with Body(tag):
        pass
    raise Reject("no thanks", requeue=False)


@app.task(bind=True, autoretry_for=(KeyError,), max_retries=1, default_retry_delay=0.1)
@limited("main", limit=LIMIT, lease_ttl=LEASE)
def auto_retry(self: Any, tag: str) -> str:
    with Body(f"{tag}:{self.request.retries}"):
        pass
    if self.request.retries == 0:
        raise KeyError(tag)
    return tag


@app.task(bind=True)
@limited("main", limit=LIMIT, lease_ttl=LEASE)
def fail(self: Any, tag: str) -> None:
    with Body(tag):
        pass
    raise RuntimeError(f"boom {tag}")


@app.task(bind=True, soft_time_limit=0.3)
@limited("main", limit=LIMIT, lease_ttl=LEASE)
def soft_limited(self: Any, tag: str) -> str:
    with Body(tag):
        try:
            time.sleep(5)
        except SoftTimeLimitExceeded:
            return "soft"
    return "not soft"


@app.task(bind=True, time_limit=0.5)
@limited("main", limit=LIMIT, lease_ttl=LEASE)
def hard_limited(self: Any, tag: str) -> None:
    bookkeeping().rpush(f"{PREFIX}:ran", tag)
    time.sleep(30)


@app.task(bind=True)
@limited("main", limit=LIMIT, lease_ttl=LEASE)
def sleeper(self: Any, tag: str, seconds: float = 30.0) -> None:
    """Runs long (for revoke/terminate, kill and shutdown tests); records its pid."""
    bookkeeping().rpush(f"{PREFIX}:ran", tag)
    bookkeeping().set(f"{PREFIX}:pid:{tag}", os.getpid())
    time.sleep(seconds)


@app.task(bind=True)
@limited("main", limit=LIMIT, lease_ttl=LEASE)
def suicide(self: Any, tag: str) -> None:
    bookkeeping().rpush(f"{PREFIX}:ran", tag)
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(bind=True, max_retries=0)
@limited(
    "main",
    limit=LIMIT,
    lease_ttl=LEASE,
    retry_backoff=0.05,
    retry_backoff_max=0.2,
    slot_wait_timeout=0.0,
)
def no_retries_left(self: Any, tag: str, seconds: float = 0.2) -> str:
    with Body(tag):
        time.sleep(seconds)
    return tag


@app.task(bind=True)
@limited(
    "main",
    limit=LIMIT,
    lease_ttl=LEASE,
    max_wait=0.5,
    slot_wait_timeout=0.1,
    retry_backoff=0.05,
    retry_backoff_max=0.1,
)
def impatient(self: Any, tag: str) -> str:
    with Body(tag):
        pass
    return tag


@app.task(bind=True)
@limited(
    "main",
    limit=LIMIT,
    lease_ttl=LEASE,
    slot_wait_timeout=0.0,
    retry_backoff=30.0,
    retry_backoff_max=30.0,
    retry_jitter=False,
)
def parks_long(self: Any, tag: str, seconds: float = 0.05) -> str:
    """Parks with a 30 s countdown when busy: it can only run soon if a release wakes it."""
    with Body(tag):
        time.sleep(seconds)
    return tag


@app.task(bind=True)
def unlimited(self: Any, tag: str, seconds: float = 0.05) -> str:
    bookkeeping().rpush(f"{PREFIX}:unlimited", tag)
    bookkeeping().rpush(f"{PREFIX}:unlimited_started", f"{tag}:{time.time()}")
    time.sleep(seconds)
    return tag


@app.task(bind=True)
@limited("main", limit=LIMIT, lease_ttl=LEASE)
def work_how(self: Any, tag: str, seconds: float = 0.05) -> str:
    """``work`` that also records how its body got the permit: the gate's directive (``run``:
    granted in the consumer; ``standby``: sent ahead to wait in its slot), ``-`` for none."""
    from celery_semaphore.integration.delivery import Directive

    directive = Directive.from_request(self.request)
    bookkeeping().rpush(f"{PREFIX}:how", f"{tag}:{directive.do if directive else '-'}")
    with Body(tag):
        time.sleep(seconds)
    return tag


class Transcode(LimitedTask):
    semaphore_name = "main"
    semaphore_limit = LIMIT
    semaphore_lease_ttl = LEASE

    def run(self, tag: str, seconds: float = 0.05) -> str:
        with Body(tag):
            time.sleep(seconds)
        return tag


transcode = app.register_task(Transcode())


@app.task(base=LimitedTask, semaphore_name="main", semaphore_limit=LIMIT, semaphore_lease_ttl=LEASE)
def via_base(tag: str, seconds: float = 0.05) -> str:
    with Body(tag):
        time.sleep(seconds)
    return tag


# -- added for the pool, broker, heartbeat, shutdown and redelivery tests ---------------------


@app.task(bind=True)
@limited("one", limit=1, lease_ttl=LEASE)
def work_one(self: Any, tag: str, seconds: float = 0.05) -> str:
    """Like ``work``, on a second semaphore ("one") whose limit is always 1; returns the node
    that ran it."""
    with Body(tag, "one"):
        time.sleep(seconds)
    return str(self.request.hostname)


@app.task(bind=True)
@limited("main", limit=LIMIT, lease_ttl=LEASE)
def work_where(self: Any, tag: str, seconds: float = 0.05) -> str:
    """Like ``work``; returns the node that ran it."""
    with Body(tag):
        time.sleep(seconds)
    return str(self.request.hostname)


@app.task(bind=True, acks_late=True, reject_on_worker_lost=True)
@limited("main", limit=LIMIT, lease_ttl=LEASE)
def crash_once(self: Any, tag: str, seconds: float = 0.5) -> str:
    """SIGKILLs its own process on the first delivery (holding the permit); the message is
    then redelivered, and that run completes."""
    r = bookkeeping()
    r.rpush(f"{PREFIX}:attempts:{tag}", f"{os.getpid()}:{self.request.delivery_info}")
    if r.set(f"{PREFIX}:crashed:{tag}", os.getpid(), nx=True):
        time.sleep(seconds)  # hold the permit for a moment, so the test can see it
        os.kill(os.getpid(), signal.SIGKILL)
    with Body(tag):
        time.sleep(seconds)
    return f"{tag}:redelivered"


@app.task(bind=True, acks_late=True)
@limited("main", limit=LIMIT, lease_ttl=LEASE)
def late_work(self: Any, tag: str, seconds: float = 0.05) -> str:
    """Like ``work``, but acknowledged only after the body (acks_late)."""
    with Body(tag):
        time.sleep(seconds)
    return tag


# -- names and weights from the arguments (issue 4) -------------------------------------------


@app.task(bind=True)
@limited("cust:{customer}", limit=LIMIT, lease_ttl=LEASE)
def per_customer(self: Any, customer: str | None, tag: str, seconds: float = 0.2) -> str:
    """One semaphore per customer; counted per customer and over all customers."""
    with Body(tag, f"cust-{customer}"), Body(f"{tag}+", "all-customers"):
        time.sleep(seconds)
    return tag


@app.task(bind=True)
@limited("units", limit=4, lease_ttl=LEASE, weight=lambda a: a["units"])
def weighted(self: Any, tag: str, units: int, seconds: float = 0.1) -> str:
    """Takes ``units`` of the 4 units of "units"; counted in units."""
    with Body(tag, "units", units):
        time.sleep(seconds)
    return tag


# -- fair sharing between queues (issue 4) ----------------------------------------------------


def _queue_of(task: Any) -> str:
    return str((task.request.delivery_info or {}).get("routing_key") or "")


def _fair_body(task: Any, tag: str, seconds: float, counter: str) -> str:
    """Record the grant (tag, fencing token, queue) and count the body per queue and in all."""
    from celery_semaphore import current_permits

    queue = _queue_of(task)
    fencing = current_permits()[0].fencing_token
    node = task.request.hostname
    bookkeeping().rpush(f"{PREFIX}:grants", f"{tag}|{fencing}|{queue}|{node}")
    with Body(tag, f"{counter}-{queue}"), Body(f"{tag}+", counter):
        time.sleep(seconds)
    return tag


@app.task(bind=True)
@limited("fair", limit=LIMIT, lease_ttl=LEASE)
def fair_work(self: Any, tag: str, seconds: float = 0.02) -> str:
    """Partitioned by delivery queue (the default)."""
    return _fair_body(self, tag, seconds, "fair")


@app.task(bind=True)
@limited("fifo", limit=LIMIT, lease_ttl=LEASE, partition=None)
def fifo_work(self: Any, tag: str, seconds: float = 0.02) -> str:
    """One line for all queues (fairness off)."""
    return _fair_body(self, tag, seconds, "fifo")


# -- several semaphores per task (issue 4) ----------------------------------------------------


@app.task(bind=True)
@limited(["pair:{a}", "pair:{b}"], limit=1, lease_ttl=LEASE)
def pair(self: Any, a: int, b: int, tag: str, seconds: float = 0.02) -> str:
    """Takes the semaphores of two resources at once; counted per resource."""
    with Body(tag, f"pair-{a}"), Body(f"{tag}+", f"pair-{b}"):
        time.sleep(seconds)
    return tag


@app.task(bind=True)
@limited("stack-db", limit=2, lease_ttl=LEASE)
@limited("stack-api:{customer}", limit=1)
def stacked(self: Any, customer: str, tag: str, seconds: float = 0.05) -> str:
    """Two stacked @limited: the shared db (2) and one per customer (1), all or nothing."""
    with Body(tag, "stack-db"), Body(f"{tag}+", f"stack-{customer}"):
        time.sleep(seconds)
    return tag


# -- confined failures: a per-key callable that raises fails its task, not the worker ----------

TIERS = {"free": 1, "pro": LIMIT}


@app.task(bind=True)
@limited("tier:{tenant}", limit=lambda a: TIERS[a["tier"]], lease_ttl=LEASE)
def by_tier(self: Any, tenant: str, tier: str, tag: str) -> str:
    """Its limit is looked up per call: an unknown ``tier`` raises KeyError in the callable."""
    with Body(tag, f"tier-{tenant}"):
        time.sleep(0.02)
    return tag


@app.task(bind=True)
@limited("main", limit=LIMIT, lease_ttl=LEASE, max_wait=7.0)
def waits_seven(self: Any, tag: str) -> str:
    """Gives up 7 s after it first arrived, however it waited meanwhile (held, parked)."""
    with Body(tag):
        pass
    return tag
