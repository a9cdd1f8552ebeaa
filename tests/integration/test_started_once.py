"""What a user sees stays true: with ``task_track_started``, a limited task that waits (in its
pool slot, or parked: re-published to wait) is not STARTED while it waits, becomes STARTED
once its body runs holding its permit, and a monitor (Flower) gets one ``task-started`` event
per task, however many copies of it parking made.

Before, Celery's tracer stored STARTED as a pool child accepted the task, before the wrapper
asked for the permit, and the worker sent ``task-started`` at every accept: a task waiting in
its slot showed STARTED, and each parked copy started it again.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from . import proj
from .helpers import finished_at, ledger, started_at
from .workers import Env, start_worker, wait_until

pytestmark = pytest.mark.timeout(120)


class Monitor:
    """The task events the workers send, as a monitor such as Flower receives them."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.seen: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._run, name="test-monitor", daemon=True)

    def _record(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.seen.append(event)

    def _run(self) -> None:
        with self.app.connection_for_read() as conn:
            self._receiver = self.app.events.Receiver(conn, handlers={"*": self._record})
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(timeout=5)

    def events(self, type_: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.seen if e.get("type") == type_]

    def from_host(self, hostname: str) -> bool:
        with self._lock:
            return any(e.get("hostname") == hostname for e in self.seen)


@pytest.fixture
def monitor(env: Env) -> Iterator[Monitor]:
    m = Monitor(env.client_app())
    m.start()
    yield m
    m.stop()


@pytest.mark.parametrize(
    "extra",
    [
        # no gate: the task waits in its slot, then parks, again and again
        pytest.param(
            {
                "semaphore_worker_hold": 0,
                "semaphore_slot_wait_timeout": 0.3,
                "semaphore_retry_backoff": 0.2,
                "semaphore_retry_backoff_max": 0.4,
            },
            id="slot-and-park",
        ),
        pytest.param({}, id="gate"),  # held off the pool, then run with the gate's grant
    ],
)
def test_a_waiting_task_is_started_once_when_its_body_runs(
    env: Env, monitor: Monitor, extra: dict[str, Any]
) -> None:
    env.limit = 1
    env.extra.update(task_track_started=True, **extra)
    worker = start_worker(env, pool="prefork", concurrency=2, extra_args=["-E"])
    app = env.client_app()
    try:
        wait_until(lambda: monitor.from_host(worker.name), 30, what="the worker's events arrive")
        first = app.send_task(proj.work.name, ("first", 3.0))
        wait_until(lambda: first.state == "STARTED", 20, what="the first body runs")
        second = app.send_task(proj.work.name, ("second", 1.5))
        # sampled while first's body runs (its ledger entry is written as the body ends, while
        # the permit is still held): first's permit is released before its SUCCESS is stored,
        # so between the two the second can rightly be STARTED already
        seen_waiting = []
        for _ in range(400):  # 20 s at most; first's body runs 3 s
            if "first" in finished_at(env):
                break
            seen_waiting.append(second.state)
            time.sleep(0.05)
        assert "first" in finished_at(env), "the first body did not end in 20 s"
        assert first.get(timeout=10) == "first"
        assert "STARTED" not in seen_waiting, f"STARTED while it waited: {seen_waiting}"
        wait_until(lambda: second.state in ("STARTED", "SUCCESS"), 20, what="the second body runs")
        assert second.state == "STARTED"  # its body runs 1.5 s
        assert second.get(timeout=20) == "second"
        wait_until(
            lambda: any(e["uuid"] == second.id for e in monitor.events("task-succeeded")),
            10,
            what="the last event arrives",
        )
        started = Counter(e["uuid"] for e in monitor.events("task-started"))
        assert started[first.id] == 1, started
        assert started[second.id] == 1, started
        if extra:  # it did park: each copy was received again
            received = Counter(e["uuid"] for e in monitor.events("task-received"))
            assert received[second.id] > 1, received
    finally:
        worker.stop()


def _ten_tasks(
    env: Env, monitor: Monitor, worker: Any, seconds: float
) -> tuple[list[str], list[Any]]:
    """Once the worker's events reach ``monitor``: ten ``work_how`` tasks of ``seconds`` each,
    sent and done; their tags and results."""
    app = env.client_app()
    wait_until(lambda: monitor.from_host(worker.name), 30, what="the worker's events arrive")
    tags = [f"t{i}" for i in range(10)]
    results = [app.send_task(proj.work_how.name, (tag, seconds)) for tag in tags]
    assert [r.get(timeout=60) for r in results] == tags
    return tags, results


def _hows(env: Env) -> dict[str, str]:
    """How each task got its permit, by tag; some must have stood by."""
    hows = dict(item.split(":", 1) for item in ledger(env, "how"))
    assert "standby" in hows.values(), hows  # some did stand by
    return hows


def test_tasks_sent_ahead_to_stand_by_are_started_once(env: Env, monitor: Monitor) -> None:
    """A task the gate sends ahead into a free slot (standby) is accepted there before its
    grant: its task-started event comes from its body, once, as it starts (not as the slot
    accepts it, a body's time before)."""
    env.limit = 1
    env.extra.update(task_track_started=True, semaphore_worker_standby=2)
    worker = start_worker(env, pool="prefork", concurrency=4, extra_args=["-E"])
    try:
        tags, results = _ten_tasks(env, monitor, worker, 0.5)
        ids = {r.id for r in results}
        wait_until(
            lambda: ids <= {e["uuid"] for e in monitor.events("task-succeeded")},
            10,
            what="the last events arrive",
        )
        hows = _hows(env)
        events = monitor.events("task-started")
        started = Counter(e["uuid"] for e in events)
        assert {started[i] for i in ids} == {1}, started
        said = {e["uuid"]: float(e["timestamp"]) for e in events}
        began = started_at(env)
        early = {
            tag: round(began[tag] - said[r.id], 3)
            for tag, r in zip(tags, results, strict=True)
            if hows[tag] == "standby" and began[tag] - said[r.id] > 0.25
        }
        assert not early, f"said started before its body began (s): {early}"
    finally:
        worker.stop()


def test_without_task_events_a_standby_sends_no_task_started(env: Env, monitor: Monitor) -> None:
    """Without ``-E`` (``worker_send_task_events`` off) Celery sends no task events, though
    the worker's event dispatcher is on (for its heartbeats, limited to the ``worker`` group):
    a task that stood by sends none either.  Before, its body sent ``task-started`` through a
    connection of its own, in every pool child it ran in."""
    env.limit = 1
    env.extra.update(semaphore_worker_standby=2)
    worker = start_worker(env, pool="prefork", concurrency=4)
    try:
        _ten_tasks(env, monitor, worker, 0.3)
        _hows(env)
        assert monitor.events("task-started") == []
        assert monitor.events("task-received") == []  # Celery's own: none without -E
    finally:
        worker.stop()
