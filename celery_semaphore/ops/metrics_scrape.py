"""The metric families a scrape of :class:`~celery_semaphore.ops.metrics.SemaphoreCollector`
yields for each semaphore: the gauges of its state and the counters the core keeps in Redis,
read from one :meth:`~celery_semaphore.Semaphore.inspect` (and its summary, from
:func:`.views.summary`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["COUNTERS", "GAUGES", "add_semaphore", "families"]


#: the gauges a scrape reads from Redis, in the order it yields them: (key, metric name, help,
#: the label besides "semaphore": None, "partition", "window" or "reason")
GAUGES: tuple[tuple[str, str, str, str | None], ...] = (
    ("limit", "celery_semaphore_limit", "The limit in force (override, setting or code).", None),
    (
        "overridden",
        "celery_semaphore_limit_overridden",
        "1 while a runtime override (set-limit) is set.",
        None,
    ),
    ("in_use", "celery_semaphore_in_use", "Units held right now.", None),
    ("holders", "celery_semaphore_holders", "Permits held right now.", None),
    ("waiting", "celery_semaphore_waiting", "Waiters in line right now.", None),
    (
        "by_reason",
        "celery_semaphore_waiting_by_reason",
        "Waiters in line right now, by why they wait (reason: units = the semaphore is full, "
        "cap = their queue is at its cap, rate = a rate window is full, pause = an adaptive "
        "pause, starting = nothing holds them, they start when woken).",
        "reason",
    ),
    (
        "oldest",
        "celery_semaphore_oldest_wait_seconds",
        "How long the oldest waiter waits.",
        None,
    ),
    (
        "e_limit",
        "celery_semaphore_effective_limit",
        "The units that may be held now: the adaptive limit while throttles keep it below "
        "the limit in force, else that limit.",
        None,
    ),
    (
        "paused",
        "celery_semaphore_paused_seconds",
        "Seconds until a throttle pause ends (0: no pause); nobody starts until then.",
        None,
    ),
    ("p_cap", "celery_semaphore_partition_cap", "A partition's cap.", "partition"),
    ("p_used", "celery_semaphore_partition_in_use", "Units a partition holds.", "partition"),
    ("p_wait", "celery_semaphore_partition_waiting", "A partition's waiters.", "partition"),
    (
        "r_limit",
        "celery_semaphore_rate_limit",
        "A rate window's count: the most weight that may start in any period (window: "
        'the rate, e.g. "10/s").',
        "window",
    ),
    ("r_period", "celery_semaphore_rate_period_seconds", "A rate window's period.", "window"),
    (
        "r_started",
        "celery_semaphore_rate_started",
        "Weight started in a rate window's last period.",
        "window",
    ),
    (
        "r_available",
        "celery_semaphore_rate_available",
        "Weight that may still start in a rate window now.",
        "window",
    ),
    (
        "r_opens",
        "celery_semaphore_rate_opens_in_seconds",
        "Seconds until a rate window has room for one more start (0: it has room now).",
        "window",
    ),
)
#: the counters the core keeps in Redis, in the order a scrape yields them (when it has
#: samples): (key, metric name, help)
COUNTERS: tuple[tuple[str, str, str], ...] = (
    (
        "expired",
        "celery_semaphore_leases_expired",
        "Holders whose lease ran out and whose units were taken back, whoever took them "
        "(counted in Redis by the core).",
    ),
    (
        "died",
        "celery_semaphore_process_died",
        "Holders taken back because their process's liveness record expired (the process "
        "died, or stalled past the liveness TTL), whoever took them (counted in Redis).",
    ),
    (
        "grants",
        "celery_semaphore_grants",
        "Permits ever granted, by anyone, as counted in Redis by the core.",
    ),
    (
        "throttles",
        "celery_semaphore_throttles",
        "Throttles reported (Semaphore.throttled, celery_semaphore.throttled) by anyone, as "
        "counted in Redis by the core.",
    ),
    (
        "line_full",
        "celery_semaphore_line_full",
        "Attempts refused a place, and places given to a newer waiter, because a line was "
        "full (max_waiting), as counted in Redis by the core.",
    ),
)


def families() -> dict[str, Any]:
    """A fresh metric family for each gauge and counter of a scrape, by key."""
    families: dict[str, Any] = {
        key: GaugeMetricFamily(name, doc, labels=["semaphore", *([extra] if extra else [])])
        for key, name, doc, extra in GAUGES
    }
    for key, name, doc in COUNTERS:
        families[key] = CounterMetricFamily(name, doc, labels=["semaphore"])
    return families


def add_semaphore(f: Mapping[str, Any], row: Mapping[str, Any], snap: Any) -> None:
    """One semaphore's samples: its summary (:func:`.views.summary`) and the core's counters."""
    name = row["name"]
    if row["limit"] is not None:
        f["limit"].add_metric([name], row["limit"])
    f["overridden"].add_metric([name], 1.0 if row["override"] is not None else 0.0)
    f["in_use"].add_metric([name], row["used"])
    f["holders"].add_metric([name], row["holders"])
    f["waiting"].add_metric([name], row["waiting"])
    for reason, count in row["waiting_by_reason"].items():
        f["by_reason"].add_metric([name, reason], count)
    f["oldest"].add_metric([name], row["oldest_wait"])
    effective = row["effective"]
    if effective["limit"] is not None:
        f["e_limit"].add_metric([name], effective["limit"])
    f["paused"].add_metric([name], effective["paused_for"] or 0.0)
    for part in row["partitions"]:
        label = [name, str(part.get("name", ""))]  # "": the default one
        cap = part.get("cap", part.get("limit"))
        if isinstance(cap, (int, float)):
            f["p_cap"].add_metric(label, cap)
        f["p_used"].add_metric(label, float(part.get("used") or 0))
        f["p_wait"].add_metric(label, float(part.get("waiting") or 0))
    for win in row["rates"]:
        label = [name, win["rate"]]
        f["r_limit"].add_metric(label, win["count"])
        f["r_period"].add_metric(label, win["period"])
        f["r_started"].add_metric(label, win["started"])
        f["r_available"].add_metric(label, win["available"])
        f["r_opens"].add_metric(label, win["opens_in"])
    # counters the core keeps in Redis
    f["expired"].add_metric([name], snap.reclaimed_total - snap.died_total)
    f["died"].add_metric([name], snap.died_total)
    f["grants"].add_metric([name], snap.grants_total)
    f["throttles"].add_metric([name], snap.throttles_total)
    f["line_full"].add_metric([name], snap.full_total + snap.dropped_total)
