"""Prometheus metrics for celery-semaphore (the ``[prometheus]`` extra).

Two kinds, read two ways:

* **Gauges of the fleet-wide state** (limit, units in use, holders, waiters and why they
  wait, oldest wait, per semaphore and per partition; each rate window's count, starts and
  room; the effective limit and the throttle pause) are read from Redis when Prometheus
  scrapes, by :class:`SemaphoreCollector`.  They are right whichever
  process serves them, so they need no multiprocess care; every exporter reports the same
  values (aggregate them with ``max``).
* **Counters and histograms of what happened** (acquired, waits, time-outs, lost leases,
  reclaimed permits; wait and hold time) are counted where it happened, in the process that
  ran the task, from :mod:`~celery_semaphore.integration.events`.  On the prefork pool that is
  a child process, so they use prometheus_client's multiprocess mode
  (``PROMETHEUS_MULTIPROC_DIR``): each child writes its own file, and the exporter adds them up.

Running the exporter: set ``semaphore_metrics_port`` (and ``semaphore_metrics_address``) and
every worker serves ``/metrics`` from its main process, creating a fresh
``PROMETHEUS_MULTIPROC_DIR`` for itself unless one is set.  Or run
``celery -A proj semaphore metrics --port 9808`` beside the workers (gauges only, plus the
counters of workers that share its ``PROMETHEUS_MULTIPROC_DIR``).  For your own exporter::

    from celery_semaphore.ops import metrics

    metrics.enable()                                        # count events in this process
    REGISTRY.register(metrics.SemaphoreCollector(app))      # and read the gauges from Redis

See docs/metrics.md for every metric and an example dashboard.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

try:
    import prometheus_client
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector, CollectorRegistry
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "celery-semaphore metrics need prometheus_client, which is not installed: "
        "pip install 'celery-semaphore[prometheus]' (or, from a checkout of the source, "
        "pip install -e '.[prometheus]'; or just pip install prometheus_client)"
    ) from exc

from .. import logs
from ..integration import events
from . import metrics_scrape as scrape

__all__ = [
    "HOLD_BUCKETS",
    "WAIT_BUCKETS",
    "EventMetrics",
    "SemaphoreCollector",
    "enable",
    "exporter_registry",
    "multiprocess_dir",
    "start_exporter",
]

log = logs.get("metrics")

#: seconds; a wait spans a few milliseconds (a handoff) to many minutes (a long line)
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
#: seconds a permit is held (the task body)
HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 1800, 3600)

#: how long the collector reuses its list of known semaphores before reading it again
KNOWN_TTL = 30.0


def multiprocess_dir() -> str | None:
    """``PROMETHEUS_MULTIPROC_DIR`` when set (prometheus_client's multiprocess mode)."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class EventMetrics:
    """Counters and histograms fed by :mod:`celery_semaphore.integration.events` in this process."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram

        def counter(name: str, doc: str, *labels: str) -> Any:
            return Counter(name, doc, ["semaphore", *labels], registry=None)

        self.acquired = counter("celery_semaphore_acquired", "Permits granted to tasks.")
        self.waits = counter(
            "celery_semaphore_waits",
            "Times a task could not get a permit at once (mode: held = held by a worker, "
            "off the pool; slot = waiting in a slot of its worker; parked = parked in the "
            "broker, re-published with a countdown).",
            "mode",
        )
        self.timeouts = counter(
            "celery_semaphore_timeouts", "Tasks that gave up waiting (max_wait, eager bound)."
        )
        self.dropped = counter(
            "celery_semaphore_dropped",
            "Tasks ended without running because their line was full (max_waiting; reason: "
            "full = no place for it, replaced = a newer task took its place, keep_newest).",
            "reason",
        )
        self.lease_lost = counter(
            "celery_semaphore_lease_lost", "Running tasks whose permit was found gone."
        )
        self.reclaimed = counter(
            "celery_semaphore_reclaimed",
            "Permits taken back from holders that could not release them (reason: expired = "
            "lease ran out, crashed = a dead process's permit released by the worker, "
            "process_died = its process's liveness record expired, found by a sweep, "
            "forced = an operator released a running task's permit).",
            "reason",
        )
        self.wait_seconds = Histogram(
            "celery_semaphore_wait_seconds",
            "Seconds from a task's first try to its grant.",
            ["semaphore"],
            buckets=WAIT_BUCKETS,
            registry=None,
        )
        self.hold_seconds = Histogram(
            "celery_semaphore_hold_seconds",
            "Seconds a task held its permit.",
            ["semaphore"],
            buckets=HOLD_BUCKETS,
            registry=None,
        )

    def collectors(self) -> list[Any]:
        return [
            self.acquired,
            self.waits,
            self.timeouts,
            self.dropped,
            self.lease_lost,
            self.reclaimed,
            self.wait_seconds,
            self.hold_seconds,
        ]

    def __call__(self, kind: str, fields: dict[str, Any]) -> None:
        """The events subscriber."""
        name = str(fields.get("name", ""))
        if kind == "acquired":
            self.acquired.labels(name).inc()
            self.wait_seconds.labels(name).observe(max(0.0, float(fields.get("wait") or 0.0)))
        elif kind == "released":
            self.hold_seconds.labels(name).observe(max(0.0, float(fields.get("hold") or 0.0)))
        elif kind == "waited":
            self.waits.labels(name, str(fields.get("mode", ""))).inc()
        elif kind == "timed_out":
            self.timeouts.labels(name).inc()
        elif kind == "lease_lost":
            self.lease_lost.labels(name).inc()
        elif kind == "dropped":
            self.dropped.labels(name, str(fields.get("reason", ""))).inc()
        elif kind == "reclaimed":
            reason = str(fields.get("reason", ""))
            self.reclaimed.labels(name, reason).inc(int(fields.get("count") or 1))


_lock = threading.Lock()
_events: EventMetrics | None = None
_registered: set[int] = set()


def enable(registry: CollectorRegistry | None = None) -> EventMetrics:
    """Count events in this process from now on (idempotent).

    With ``registry`` (e.g. ``prometheus_client.REGISTRY``), also register the counters and
    histograms there, for an exporter you run yourself; in multiprocess mode they are read
    from ``PROMETHEUS_MULTIPROC_DIR`` instead (use ``MultiProcessCollector``)."""
    global _events
    with _lock:
        if _events is None:
            _events = EventMetrics()
            events.subscribe(_events)
        if registry is not None and id(registry) not in _registered and not multiprocess_dir():
            for collector in _events.collectors():
                registry.register(collector)
            _registered.add(id(registry))
        return _events


class SemaphoreCollector(Collector):
    """Gauges of every known semaphore, read from Redis at each scrape.

    :param app: the Celery app (its Redis, key prefix, limited tasks and settings).
    :param scan: also SCAN Redis for semaphores nobody registered (costly on big databases).
    """

    def __init__(self, app: Any, *, scan: bool = False) -> None:
        from ..integration.config import redis_settings

        self.app = app
        self.scan = scan
        self.redis = redis_settings(app.conf)
        self.url = self.redis.url
        self.prefix = str(app.conf.get("semaphore_key_prefix", "celery_semaphore"))
        self._client: Any = None
        self._known: dict[str, Any] = {}
        self._known_at = -KNOWN_TTL
        self._semaphores: dict[tuple[str, int | None], Any] = {}
        self._lock = threading.Lock()

    def describe(self) -> list[Any]:
        return []  # nothing to read at registration time

    def _redis(self) -> Any:
        if self._client is None:
            from ..core.connection import redis_client

            self._client = redis_client(
                self.url,
                cluster=self.redis.cluster,
                options=self.redis.options,
                socket_connect_timeout=3,
                socket_timeout=5,
                retries=1,
            )
        return self._client

    def _entries(self) -> dict[str, Any]:
        from . import registry

        now = time.monotonic()
        if now - self._known_at >= KNOWN_TTL:
            self._known = registry.known(self._redis(), self.prefix, self.app, scan=self.scan)
            self._known_at = now
        return self._known

    def _semaphore(self, entry: Any) -> Any:
        from .views import semaphore_for_known

        key = (entry.name, entry.configured_limit)
        sem = self._semaphores.get(key)
        if sem is None:
            hash_tag = self.app.conf.get("semaphore_hash_tag", None)
            sem = semaphore_for_known(self._redis(), self.prefix, entry, hash_tag)
            self._semaphores[key] = sem
        return sem

    def collect(self) -> Iterator[Any]:
        from .views import summary

        families = scrape.families()
        up = GaugeMetricFamily("celery_semaphore_redis_up", "1 when the last read of Redis worked.")
        ok = 1.0
        try:
            with self._lock:
                for entry in list(self._entries().values()):
                    snap = self._semaphore(entry).inspect()
                    scrape.add_semaphore(families, summary(entry, snap), snap)
        except Exception as exc:  # a scrape must answer: report Redis down, not a 500
            log.warning(
                "celery-semaphore metrics: reading Redis failed: %s",
                exc,
                semaphore=None,
                task_id=None,
            )
            ok = 0.0
        up.add_metric([], ok)
        yield from (families[key] for key, *_ in scrape.GAUGES)
        yield from (families[key] for key, *_ in scrape.COUNTERS if families[key].samples)
        yield up


def exporter_registry(app: Any, *, scan: bool = False) -> CollectorRegistry:
    """A registry with the gauges of ``app``'s semaphores and this host's event metrics (from
    ``PROMETHEUS_MULTIPROC_DIR`` when set, else this process's)."""
    registry = CollectorRegistry()
    directory = multiprocess_dir()
    if directory:
        from prometheus_client.multiprocess import MultiProcessCollector

        MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    elif _events is not None:
        for collector in _events.collectors():
            registry.register(collector)
    registry.register(SemaphoreCollector(app, scan=scan))
    return registry


def start_exporter(
    app: Any, *, port: int, address: str = "0.0.0.0", scan: bool = False
) -> tuple[Any, threading.Thread]:
    """Serve ``/metrics`` on ``address:port`` from a daemon thread; return (server, thread)."""
    server, thread = prometheus_client.start_http_server(
        port, addr=address, registry=exporter_registry(app, scan=scan)
    )
    log.info(
        "celery-semaphore metrics on http://%s:%d/metrics",
        address,
        port,
        semaphore=None,
        task_id=None,
    )
    return server, thread
