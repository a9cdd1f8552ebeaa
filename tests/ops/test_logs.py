"""The logs keep the contract of docs/logging.md: one logger per concern, waits at INFO, lost
leases and forced releases at WARNING or ERROR, every record naming its semaphore and task.

The Celery tests run a real worker in this process (Celery's embedded ``start_worker``, threads
pool, Redis broker; the gate is installed at ``worker_init`` as in a ``celery worker``), so the
records reach ``caplog``; task bodies block on events the test sets, and every wait is on a log
record or an event, never a sleep.
"""

from __future__ import annotations

import ast
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery, signals
from celery.contrib.testing import tasks as _ping_task  # noqa: F401 (start_worker pings it)
from celery.contrib.testing.worker import start_worker

from celery_semaphore import Semaphore, limited, logs
from celery_semaphore.integration import events
from celery_semaphore.integration.heartbeat import heartbeat
from celery_semaphore.ops.audit import operator
from tests.log_records import LogRecords as Waiter

from .conftest import make_app, run_cli

pytestmark = pytest.mark.timeout(120)

PACKAGE = Path(logs.__file__).parent
NAME = "logs-sem"


@pytest.fixture
def records(caplog: pytest.LogCaptureFixture) -> Iterator[Waiter]:
    caplog.set_level(logging.DEBUG, logger="celery_semaphore")
    waiter = Waiter()
    root = logging.getLogger("celery_semaphore")
    root.addHandler(waiter)
    try:
        yield waiter
    finally:
        root.removeHandler(waiter)


def on(
    logger: str, level: int, task_id: str | None, text: str
) -> Callable[[logging.LogRecord], bool]:
    def match(record: logging.LogRecord) -> bool:
        return (
            record.name == f"celery_semaphore.{logger}"
            and record.levelno == level
            and getattr(record, "task_id", "?") == task_id
            and text in record.getMessage()
        )

    return match


def assert_names(record: logging.LogRecord, semaphore: str | None, task_id: str | None) -> None:
    """The record carries both attributes, and the text leads with them."""
    assert record.semaphore == semaphore  # type: ignore[attr-defined]
    assert record.task_id == task_id  # type: ignore[attr-defined]
    if semaphore is not None:
        assert record.getMessage().startswith(f"[semaphore={semaphore} task={task_id or '-'}] ")


# -- the loggers ------------------------------------------------------------------------------


def used_concerns() -> dict[str, set[str]]:
    """Concern -> the modules that log on it (``logs.get("...")`` calls), from the source."""
    used: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "logs"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                used.setdefault(str(node.args[0].value), set()).add(path.stem)
    return used


#: the modules of the gate package (integration/gate/) that log, by concern
GATE = {
    "arrivals",
    "attempts",
    "forwarding",
    "gate_thread",
    "giveback",
    "health",
    "hook",
    "reaper",
    "upkeep",
}
GATE_WAIT = {"dispatch", "giveback", "ready", "upkeep", "waitlog"}
GATE_RELEASE = {"dispatch", "giveback"}


def test_each_concern_has_one_logger_and_the_modules_of_that_concern_use_it() -> None:
    used = used_concerns()
    assert set(used) == set(logs.LOGGERS), "a concern without a logger, or a logger unlisted"
    expected = {
        "acquire": {"asking", "full", "gated", "hold", "started"},
        # the gate package's modules: see GATE_WAIT, GATE_RELEASE, GATE below
        "wait": {"asking", "slot", "slot_standby", "park", "wakes", "discarded", *GATE_WAIT},
        "release": {"hold", "slot", "signals", "heartbeat", *GATE_RELEASE},
        "heartbeat": {"heartbeat", "lost"},
        "restart": {"restart"},
        "gate": GATE,
        "config": {"signals", "connection"},
        # liveness: a process's one liveness record (a failed refresh is a WARNING)
        "semaphore": {"base", "liveness", "waiting"},
        "registry": {"worker_hooks"},
        "metrics": {"worker_hooks", "metrics"},
        "events": {"events"},
        "cli": {"audit", "web"},
    }
    assert used == expected
    # nothing logs around the helper (a bare logging.getLogger would drop the two fields);
    # parked.py only puts a filter on Celery's own trace logger
    bare = [
        p.name
        for p in PACKAGE.rglob("*.py")
        if p.name not in ("logs.py", "parked.py") and "getLogger" in p.read_text(encoding="utf-8")
    ]
    assert bare == []
    for concern in logs.LOGGERS:
        assert logs.get(concern).name == f"celery_semaphore.{concern}"
    with pytest.raises(ValueError, match="concern='acquired' is not accepted"):
        logs.get("acquired")


def test_a_record_carries_both_fields_in_its_text_and_as_attributes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="celery_semaphore")
    log = logs.get("wait")
    log.info("waits (position %d)", 3, semaphore="odd%name", task_id="t-1")
    log.warning("no task", semaphore="s", task_id=None)
    log.error("neither", semaphore=None, task_id=None)
    log.debug("100% literal, no arguments", semaphore="p%s", task_id="t-2")
    first, second, third, fourth = caplog.records
    assert first.getMessage() == "[semaphore=odd%name task=t-1] waits (position 3)"
    assert_names(first, "odd%name", "t-1")
    assert second.getMessage() == "[semaphore=s task=-] no task"
    assert_names(second, "s", None)
    assert third.getMessage() == "neither"
    assert_names(third, None, None)
    assert fourth.getMessage() == "[semaphore=p%s task=t-2] 100% literal, no arguments"
    # the record points at the caller's line, not at the helper
    assert {r.filename for r in caplog.records} == {Path(__file__).name}
    # a format naming the fields works for every record of the package
    formatter = logging.Formatter("%(semaphore)s|%(task_id)s|%(message)s")
    assert formatter.format(third) == "None|None|neither"


# -- through a real worker --------------------------------------------------------------------


@pytest.fixture
def app(redis_url: str, key_prefix: str, redis_client: redis.Redis) -> Iterator[Celery]:
    app = make_app(
        redis_url,
        key_prefix,
        task_default_queue=f"{key_prefix}-q",
        worker_hijack_root_logger=False,  # keep caplog's handler on the root logger
        broker_connection_retry_on_startup=True,
    )
    before = set(events._subscribers)
    try:
        yield app
    finally:
        # the embedded worker's worker_init subscribes in this process for good (a real
        # worker's process ends): leave no subscriber behind for the other tests
        for fn in set(events._subscribers) - before:
            events.unsubscribe(fn)
        redis_client.delete(f"{key_prefix}-q")
        app.close()


class Bodies:
    """Task bodies that run until the test lets them finish."""

    def __init__(self) -> None:
        self.started: dict[str, threading.Event] = {}
        self.finish: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    def events(self, task_id: str) -> tuple[threading.Event, threading.Event]:
        with self.lock:
            return (
                self.started.setdefault(task_id, threading.Event()),
                self.finish.setdefault(task_id, threading.Event()),
            )

    def run(self, task_id: str) -> None:
        started, finish = self.events(task_id)
        started.set()
        assert finish.wait(30), "the test never let the body finish"

    def release_all(self) -> None:
        with self.lock:
            for event in self.finish.values():
                event.set()


@pytest.fixture
def bodies() -> Iterator[Bodies]:
    b = Bodies()
    yield b
    b.release_all()


def test_acquire_wait_forced_release_lost_lease_and_release_are_logged(
    app: Celery, bodies: Bodies, records: Waiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    @app.task(name="logs.hold", bind=True, shared=False)
    @limited(NAME, limit=1, lease_ttl=3.0)  # heartbeat every second
    def hold(self: Any) -> None:
        bodies.run(self.request.id)

    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        first = hold.delay()
        started, finish_first = bodies.events(first.id)
        assert started.wait(20), "the first task never started"
        acquired = records.wait_for(
            "the grant, at DEBUG", on("acquire", logging.DEBUG, first.id, "acquired 1 unit(s)")
        )
        assert_names(acquired, NAME, first.id)

        second = hold.delay()
        waits = records.wait_for(
            "the second task's wait, at INFO", on("wait", logging.INFO, second.id, "waits")
        )
        assert_names(waits, NAME, second.id)
        assert "(limit 1, position " in waits.getMessage()

        # an operator forces the first task's permit free: logged with who did it
        result = run_cli(app, "release", NAME, "--task-id", first.id, "--yes")
        assert result.exit_code == 0, result.output
        forced = records.wait_for(
            "the forced release", on("cli", logging.WARNING, first.id, "release by")
        )
        assert_names(forced, NAME, first.id)
        who = operator()
        assert forced.operator == f"{who['user']}@{who['host']}"  # type: ignore[attr-defined]
        assert forced.action == "release"  # type: ignore[attr-defined]
        assert f"release by {who['user']}@{who['host']} (pid {who['pid']})" in forced.getMessage()

        # the first task still runs: its heartbeat finds the permit gone, and says why
        lost = records.wait_for(
            "the forced release, seen by the heartbeat, at WARNING",
            on("heartbeat", logging.WARNING, first.id, "permit RELEASED"),
        )
        assert_names(lost, NAME, first.id)
        assert f"forced by {who['user']}@{who['host']}" in lost.getMessage()

        # the freed unit went to the waiting task
        started_second, finish_second = bodies.events(second.id)
        assert started_second.wait(20), "the waiting task never got the freed permit"
        granted = records.wait_for(
            "the second grant", on("acquire", logging.DEBUG, second.id, "acquired")
        )
        assert_names(granted, NAME, second.id)

        finish_first.set()
        finish_second.set()
        first.get(timeout=20)
        second.get(timeout=20)
        gone = records.wait_for(
            "the first task's release", on("release", logging.DEBUG, first.id, "released")
        )
        assert "(its lease had been lost)" in gone.getMessage()
        released = records.wait_for(
            "the second task's release", on("release", logging.DEBUG, second.id, "released")
        )
        assert "(" not in released.getMessage().split("] ", 1)[1]  # a plain release
        assert_names(released, NAME, second.id)

        # a holder that stops refreshing while a task waits for the unit: the worker's sweep
        # (of the names its process holds or waits on) reclaims the permit, at WARNING, and
        # the waiting task gets it.  The sweep is this process's: it also visits semaphores
        # that earlier tests left pinned, some on Redis servers long gone; only this test's
        # own are kept, so the wait below measures this worker's sweep.
        for other in heartbeat.watched():
            if other.name != NAME or other.key_prefix != key_prefix:
                heartbeat.unwatch(other)
        stray = Semaphore(NAME, 1, redis=redis_client, lease_ttl=1.0, key_prefix=key_prefix)
        assert stray.acquire(timeout=5) is not None
        third = hold.delay()
        started_third, finish_third = bodies.events(third.id)
        assert started_third.wait(20), "the waiting task never got the reclaimed permit"
        assert [h.owner.get("task_id") for h in stray.inspect().holders] == [third.id]
        assert stray.inspect().reclaimed_total == 1  # taken back, not released
        # Whichever call noticed the expired lease first took it back, and says so once: the
        # sweep (about once a second) or an acquire (the stray one above, or the waiting
        # task's own next attempt) logs it at WARNING.  (A refresh or release script of
        # another permit may also take it back first: then nobody here says it.)
        found = [
            r
            for r in records.records
            if r.levelno == logging.WARNING
            and "reclaimed 1 permit(s) whose lease" in r.getMessage()
        ]
        assert len(found) <= 1, [r.getMessage() for r in found]
        for reclaimed in found:
            assert_names(reclaimed, NAME, None)
        finish_third.set()
        third.get(timeout=20)

    # nothing but the expected lines at WARNING and above (of this test's semaphore: a
    # heartbeat an earlier test file left in this process may log of its own names)
    loud = {
        (r.name, r.getMessage().split("] ", 1)[-1][:25])
        for r in records.records
        if r.levelno >= logging.WARNING and getattr(r, "semaphore", NAME) in (NAME, None)
    }
    # (the reclaim, by the sweep or an acquire, whichever was first: see above)
    reclaim = {"celery_semaphore.release", "celery_semaphore.semaphore"}
    assert {name for name, _ in loud} - reclaim == {
        "celery_semaphore.cli",
        "celery_semaphore.heartbeat",
    }, loud


def test_the_gate_logs_a_task_it_cannot_ask_for_after_set_limit(
    app: Celery, records: Waiter
) -> None:
    """``set-limit`` takes effect on a running worker: a weight above the new limit is refused
    at the gate (ERROR on .gate, naming the semaphore and the task) and fails in its slot."""

    @app.task(name="logs.heavy", bind=True, shared=False)
    @limited(NAME, limit=2, weight=2)
    def heavy(self: Any) -> None: ...

    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False):
        assert heavy.delay().get(timeout=20) is None  # the worker knows the semaphore
        result = run_cli(app, "set-limit", NAME, "1")
        assert result.exit_code == 0, result.output
        changed = records.wait_for(
            "the set-limit", on("cli", logging.WARNING, None, "set-limit by")
        )
        assert_names(changed, NAME, None)
        refused = heavy.delay()
        with pytest.raises(ValueError, match="exceeds the limit in force"):
            refused.get(timeout=20, propagate=True)
        gated = records.wait_for(
            "the gate's refusal", on("gate", logging.ERROR, refused.id, "it goes to its slot")
        )
        assert_names(gated, NAME, refused.id)
        assert "logs.heavy" in gated.getMessage()


class WorkerStandIn:
    """What ``worker_init`` hands its receivers: the worker, with its app."""

    def __init__(self, app: Celery) -> None:
        self.app = app


def test_an_invalid_configuration_is_critical_on_config(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("logs-config", set_as_current=False)
    app.conf.update(semaphore_lease_tll=5)  # misspelt

    @app.task(name="logs.any", shared=False)
    @limited(f"logs-{uuid.uuid4().hex[:6]}", limit=1)
    def anything() -> None: ...

    caplog.set_level(logging.DEBUG, logger="celery_semaphore")
    with pytest.raises(SystemExit, match="semaphore_lease_tll") as info:
        signals.worker_init.send(sender=WorkerStandIn(app))
    # logged, so the worker exits with status 1 without printing the message a second time
    assert info.value.code == 1
    [record] = [r for r in caplog.records if r.name == "celery_semaphore.config"]
    assert record.levelno == logging.CRITICAL
    assert_names(record, None, None)
    assert "invalid configuration: unknown setting(s) semaphore_lease_tll" in record.getMessage()
    app.close()


def test_an_invalid_configuration_is_printed_when_its_logger_is_off() -> None:
    """A program whose logging configuration disabled our loggers (Django's
    ``disable_existing_loggers``) still sees why the worker stopped: the SystemExit then
    carries the message, which Python prints."""
    app = Celery("logs-config-off", set_as_current=False)
    app.conf.update(semaphore_lease_tll=5)

    @app.task(name="logs.any", shared=False)
    @limited(f"logs-{uuid.uuid4().hex[:6]}", limit=1)
    def anything() -> None: ...

    logger = logging.getLogger("celery_semaphore.config")
    logger.disabled = True
    try:
        with pytest.raises(SystemExit) as info:
            signals.worker_init.send(sender=WorkerStandIn(app))
    finally:
        logger.disabled = False
        app.close()
    assert isinstance(info.value.code, str)
    assert info.value.code.startswith(
        "celery-semaphore: invalid configuration: unknown setting(s) semaphore_lease_tll "
        "(did you mean semaphore_lease_ttl?)"
    )
