"""Prometheus metrics: event counters and histograms, the Redis-reading collector, the
settings, and the optional dependency (never imported by the package, a hint when missing)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis
from celery import Celery
from prometheus_client import CollectorRegistry

from celery_semaphore.core import liveness
from celery_semaphore.integration import config, events
from celery_semaphore.ops import metrics
from tests.conftest import SemaphoreFactory

from .conftest import make_app
from .test_cli import closed_port, owner

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_package_and_the_cli_plugin_stay_light() -> None:
    """Every `celery` command (workers too) imports the plugin: it loads neither
    prometheus_client, nor redis-py, nor the core, nor the Celery layer."""
    out = run_python(
        """
        import sys
        import celery.bin.celery  # loads every celery.commands plugin, ours included
        assert "celery_semaphore.ops.cli" in sys.modules
        heavy = ["prometheus_client", "redis", "celery_semaphore.core.semaphore",
                 "celery_semaphore.integration.body", "celery_semaphore.ops.metrics"]
        print(*[m for m in heavy if m in sys.modules])
        import celery_semaphore.integration.events
        print("prometheus_client" in sys.modules)
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["", "False"]


def test_a_missing_extra_gives_an_install_hint() -> None:
    out = run_python(
        """
        import sys
        sys.modules["prometheus_client"] = None  # as if the extra were not installed
        from celery import Celery
        from celery_semaphore.ops import worker_hooks
        try:
            import celery_semaphore.ops.metrics
        except ImportError as exc:
            print("import:", exc)
        app = Celery("x", set_as_current=False)
        app.conf.update(semaphore_metrics_port=9808, semaphore_redis_url="redis://127.0.0.1:1")
        try:
            worker_hooks.on_worker_init(app)
        except ValueError as exc:
            print("worker:", exc)
        """
    )
    assert out.returncode == 0, out.stderr
    hint = "pip install 'celery-semaphore[prometheus]'"
    # until the package is published, only the checkout's own extra installs it
    checkout = "from a checkout of the source, pip install -e '.[prometheus]'"
    lines = out.stdout.splitlines()
    assert lines[0].startswith("import: celery-semaphore metrics need prometheus_client")
    assert hint in lines[0]
    assert checkout in lines[0]
    assert lines[1].startswith("worker: semaphore_metrics_port=9808 needs prometheus_client")
    assert hint in lines[1]
    assert checkout in lines[1]


def test_the_metrics_command_without_the_extra_exits_2_with_the_hint(redis_url: str) -> None:
    out = run_python(
        f"""
        import sys
        sys.modules["prometheus_client"] = None  # as if the extra were not installed
        from tests.ops.conftest import make_app, run_cli
        result = run_cli(make_app({redis_url!r}, "cs-no-extra"), "metrics", "--port", "1")
        print(result.exit_code)
        print(result.stderr.strip())
        """
    )
    assert out.returncode == 0, out.stderr
    code, line = out.stdout.splitlines()
    assert code == "2"
    assert line.startswith("celery semaphore: error: celery-semaphore metrics need prometheus")
    assert "pip install 'celery-semaphore[prometheus]'" in line
    assert "pip install -e '.[prometheus]'" in line


def test_events_feed_the_counters_and_histograms() -> None:
    counts = metrics.EventMetrics()
    registry = CollectorRegistry()
    for collector in counts.collectors():
        registry.register(collector)
    unsubscribe = events.subscribe(counts)
    try:
        events.emit("acquired", name="x", task_id="t1", task="a", weight=1, wait=0.3)
        events.emit("acquired", name="x", task_id="t2", task="a", weight=1, wait=7.0)
        events.emit("released", name="x", task_id="t1", task="a", weight=1, hold=2.0, held=True)
        events.emit("waited", name="x", task_id="t2", task="a", mode="slot", position=0)
        events.emit("waited", name="x", task_id="t2", task="a", mode="parked", position=0)
        events.emit("waited", name="x", task_id="t3", task="a", mode="parked", position=1)
        events.emit("timed_out", name="x", task_id="t4", task="a", waited=9.0)
        events.emit("lease_lost", name="x", task_id="t5", token="t5:0")
        events.emit("reclaimed", name="x", count=3, reason="expired", task_id=None)
        events.emit("reclaimed", name="x", count=1, reason="crashed", task_id="t6")
        events.emit("dropped", name="x", task_id="t7", task="a", reason="full")
    finally:
        unsubscribe()
    events.emit("acquired", name="x", task_id="t9", task="a", weight=1, wait=0.1)  # not counted

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"semaphore": "x", **labels})

    assert value("celery_semaphore_acquired_total") == 2
    assert value("celery_semaphore_wait_seconds_count") == 2
    assert value("celery_semaphore_wait_seconds_bucket", le="0.5") == 1
    assert value("celery_semaphore_wait_seconds_sum") == pytest.approx(7.3)
    assert value("celery_semaphore_hold_seconds_count") == 1
    assert value("celery_semaphore_hold_seconds_sum") == pytest.approx(2.0)
    assert value("celery_semaphore_waits_total", mode="slot") == 1
    assert value("celery_semaphore_waits_total", mode="parked") == 2
    assert value("celery_semaphore_timeouts_total") == 1
    assert value("celery_semaphore_lease_lost_total") == 1
    assert value("celery_semaphore_reclaimed_total", reason="expired") == 3
    assert value("celery_semaphore_reclaimed_total", reason="crashed") == 1
    assert value("celery_semaphore_dropped_total", reason="full") == 1


def test_a_failing_subscriber_never_reaches_the_emitter(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    def broken(kind: str, fields: dict[str, object]) -> None:
        raise RuntimeError("boom")

    def good(kind: str, fields: dict[str, object]) -> None:
        seen.append(kind)

    before = events.subscribed()  # a worker started in this process may listen (ops)
    undo = [events.subscribe(broken), events.subscribe(good)]
    try:
        with caplog.at_level(logging.ERROR, logger="celery_semaphore.events"):
            events.emit("timed_out", name="x", task_id="t", task="a", waited=1.0)
    finally:
        for fn in undo:
            fn()
    assert seen == ["timed_out"]
    assert "event subscriber" in caplog.text
    assert "boom" in caplog.text
    assert events.subscribed() == before


def test_the_collector_reads_the_gauges_from_redis(
    app: Celery, make_semaphore: SemaphoreFactory
) -> None:
    alpha = make_semaphore("alpha", 3)
    alpha.acquire(owner=owner("t1"), weight=2)
    alpha.try_acquire("t2:0", owner=owner("t2"), place_ttl=60, weight=2)
    make_semaphore("beta", 4).set_limit_override(6)
    registry = CollectorRegistry()
    registry.register(metrics.SemaphoreCollector(app))

    def value(name: str, semaphore: str) -> float | None:
        return registry.get_sample_value(name, {"semaphore": semaphore})

    assert value("celery_semaphore_limit", "alpha") == 3
    assert value("celery_semaphore_in_use", "alpha") == 2
    assert value("celery_semaphore_holders", "alpha") == 1
    assert value("celery_semaphore_waiting", "alpha") == 1
    oldest = value("celery_semaphore_oldest_wait_seconds", "alpha")
    assert oldest is not None
    assert 0 <= oldest < 30
    assert value("celery_semaphore_limit_overridden", "alpha") == 0
    assert value("celery_semaphore_limit", "beta") == 6
    assert value("celery_semaphore_limit_overridden", "beta") == 1
    assert value("celery_semaphore_in_use", "beta") == 0
    assert registry.get_sample_value("celery_semaphore_redis_up") == 1


def test_the_collector_counts_expired_leases_whoever_took_them_back(
    app: Celery, make_semaphore: SemaphoreFactory
) -> None:
    alpha = make_semaphore("alpha", 3, lease_ttl=0.2)
    registry = CollectorRegistry()
    registry.register(metrics.SemaphoreCollector(app))

    def value(name: str) -> float | None:
        return registry.get_sample_value(name, {"semaphore": "alpha"})

    assert value("celery_semaphore_leases_expired_total") == 0
    assert value("celery_semaphore_grants_total") == 0
    alpha.acquire(owner=owner("t1"), weight=2)
    alpha.acquire(owner=owner("t2"))
    time.sleep(0.3)
    # another client's acquire (not a worker's sweep) finds both leases expired
    assert make_semaphore("alpha", 3).acquire(owner=owner("t3"), blocking=False) is not None
    assert value("celery_semaphore_leases_expired_total") == 2
    assert value("celery_semaphore_grants_total") == 3
    assert value("celery_semaphore_in_use") == 1


def test_the_collector_counts_dead_process_holders_apart_from_expired_leases(
    app: Celery, make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    liveness.stop()  # this test's records are refreshed by its own calls only
    alpha = make_semaphore("alpha", 3, liveness_ttl=30.0)
    registry = CollectorRegistry()
    registry.register(metrics.SemaphoreCollector(app))

    def value(name: str) -> float | None:
        return registry.get_sample_value(name, {"semaphore": "alpha"})

    try:
        assert value("celery_semaphore_process_died_total") == 0
        expiring = alpha.try_acquire(alpha.new_ticket(), lease_ttl=0.1).permit
        alpha._live_arg = "60000 ghost/9/abc"
        assert expiring is not None
        assert alpha.acquire(owner=owner("t1")) is not None
        redis_client.zrem(liveness.procs_key(alpha.key_prefix), "ghost/9/abc")  # its process died
        time.sleep(0.2)
        alpha._live_arg = f"30000 {liveness.ident()}"
        assert alpha.acquire(owner=owner("t2"), blocking=False) is not None  # reclaims both
        assert value("celery_semaphore_process_died_total") == 1
        assert value("celery_semaphore_leases_expired_total") == 1
        assert value("celery_semaphore_in_use") == 1
    finally:
        liveness.stop()


def test_the_collector_reports_redis_down_instead_of_failing() -> None:
    app = make_app(f"redis://127.0.0.1:{closed_port()}/0", "cs-nowhere")
    registry = CollectorRegistry()
    registry.register(metrics.SemaphoreCollector(app))
    assert registry.get_sample_value("celery_semaphore_redis_up") == 0
    app.close()


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("semaphore_metrics_port", 0),
        ("semaphore_metrics_port", 70000),
        ("semaphore_metrics_port", "9808"),
        ("semaphore_metrics_port", True),
        ("semaphore_metrics_address", ""),
        ("semaphore_metrics_address", 127),
    ],
)
def test_bad_metrics_settings_are_refused_naming_the_setting(setting: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"{setting}={value!r} is not accepted"):
        config.validate_app_settings({setting: value})


def test_good_metrics_settings_pass() -> None:
    checked = config.validate_app_settings(
        {"semaphore_metrics_port": 9808, "semaphore_metrics_address": "127.0.0.1"}
    )
    assert (checked["semaphore_metrics_port"], checked["semaphore_metrics_address"]) == (
        9808,
        "127.0.0.1",
    )
    defaults = config.validate_app_settings({})
    assert (defaults["semaphore_metrics_port"], defaults["semaphore_metrics_address"]) == (
        None,
        "0.0.0.0",
    )
