"""``@limited(priority=..., max_waiting=..., on_full=...)``: checked when the task is decorated
(a callable's value when the call runs, failing that call only), carried in the call's plan
to every attempt, and a message's ``apply_async(priority=N)`` mapped per broker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from celery import Celery

from celery_semaphore import LimitedTask, limited
from celery_semaphore.core.exceptions import SemaphoreRequestError
from celery_semaphore.integration.decorators import spec_of
from celery_semaphore.integration.locks import lock_kwargs
from celery_semaphore.integration.queues import message_priority
from celery_semaphore.integration.targets import Plan, resolve


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("unit-queueing", broker="memory://", set_as_current=False)
    app.conf.semaphore_redis_url = "redis://127.0.0.1:6379/0"
    yield app
    app.close()


def plan(task: Any, *args: Any, message: int | None = None, **kwargs: Any) -> Plan:
    spec = spec_of(task)
    assert spec is not None
    return resolve(task, spec, args, kwargs, "celery", message_priority=message)


def test_priority_and_bounded_line_reach_every_attempt(app: Celery) -> None:
    @app.task(shared=False)
    @limited("report:{user_id}", limit=1, priority=7, max_waiting=0, on_full="drop")
    def report(user_id: int) -> None: ...

    found = plan(report, 3)
    assert (found.priority, found.max_waiting, found.on_full) == (7, 0, "drop")
    assert lock_kwargs(found)["priority"] == 7
    assert lock_kwargs(found)["max_waiting"] == 0
    assert lock_kwargs(found)["keep_newest"] is False
    # the gate's plan travels to the body with its priority
    spec = spec_of(report)
    assert spec is not None
    again = Plan.from_wire(spec, found.to_wire())
    assert again == found


def test_keep_newest_and_defaults(app: Celery) -> None:
    @app.task(shared=False)
    @limited("debounce", limit=1, max_waiting=1, on_full="keep_newest")
    def newest() -> None: ...

    @app.task(shared=False)
    @limited("plain", limit=1)
    def plain() -> None: ...

    assert lock_kwargs(plan(newest))["keep_newest"] is True
    kwargs = lock_kwargs(plan(plain))
    assert "priority" not in kwargs
    assert "max_waiting" not in kwargs


def test_priority_callable_is_checked_per_call(app: Celery) -> None:
    @app.task(shared=False)
    @limited("tiered", limit=1, priority=lambda a: {"gold": 9}.get(a["tier"], 0))
    def tiered(tier: str) -> None: ...

    @app.task(shared=False)
    @limited("bad", limit=1, priority=lambda a: a["n"])
    def bad(n: Any) -> None: ...

    assert plan(tiered, "gold").priority == 9
    assert plan(tiered, "tin").priority == 0
    with pytest.raises(ValueError, match=r"task .*bad: priority \(from .*\)=12 is not accepted"):
        plan(bad, 12)
    with pytest.raises(TypeError, match=r"priority .* must be an int from 0 to 9"):
        plan(bad, "9")

    @app.task(shared=False)
    @limited("raises", limit=1, priority=lambda a: a["missing"])
    def raises(n: int) -> None: ...

    with pytest.raises(SemaphoreRequestError, match="the priority callable"):
        plan(raises, 1)


def test_message_priority_wins_and_is_mapped_per_broker(app: Celery) -> None:
    @app.task(shared=False)
    @limited("msg", limit=1, priority=2)
    def msg() -> None: ...

    assert plan(msg).priority == 2
    assert plan(msg, message=8).priority == 8
    app.conf.broker_url = "amqp://guest@localhost//"
    assert message_priority(app.conf, {"priority": 9}) == 9
    assert message_priority(app.conf, {"priority": 200}) == 9
    assert message_priority(app.conf, {}) is None
    assert message_priority(app.conf, {"priority": None}) is None
    app.conf.broker_url = "redis://localhost:6379/1"
    # lower first on Redis, where every message without a priority carries 0
    assert message_priority(app.conf, {"priority": 1}) == 8
    assert message_priority(app.conf, {"priority": 9}) == 0
    assert message_priority(app.conf, {"priority": 0}) is None


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"priority": 10}, ValueError, "priority=10 is not accepted: use an int from 0 to 9"),
        ({"priority": "high"}, TypeError, "priority must be an int from 0 to 9"),
        ({"max_waiting": -1, "on_full": "drop"}, ValueError, "max_waiting=-1"),
        ({"max_waiting": 2}, ValueError, "max_waiting=2 with on_full='wait' is not accepted"),
        ({"on_full": "drop"}, ValueError, "max_waiting=None with on_full='drop'"),
        ({"max_waiting": 1, "on_full": "newest"}, ValueError, "on_full='newest' is not"),
    ],
)
def test_bad_options_fail_at_decoration(
    app: Celery, options: dict[str, Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words) as info:

        @app.task(shared=False)
        @limited("x", limit=1, **options)
        def task() -> None: ...

    assert "@limited('x')" in str(info.value)


def test_several_semaphores_refuse_a_bounded_line(app: Celery) -> None:
    with pytest.raises(ValueError, match="not accepted on a task that takes several"):

        @app.task(shared=False)
        @limited(["a", "b"], limit=1, max_waiting=0, on_full="drop")
        def both() -> None: ...


def test_limited_task_attributes(app: Celery) -> None:
    class Report(LimitedTask):
        semaphore_name = "report"
        semaphore_limit = 1
        semaphore_priority: ClassVar[int] = 3
        semaphore_max_waiting: ClassVar[int] = 0
        semaphore_on_full: ClassVar[str] = "fail"

        def run(self) -> None: ...

    spec = Report._semaphore_spec
    assert spec is not None
    assert (spec.priority, spec.max_waiting, spec.on_full) == (3, 0, "fail")


def test_priority_step_setting_is_checked(app: Celery) -> None:
    from celery_semaphore.integration.config import validate_app_settings

    app.conf.semaphore_priority_step = -1
    with pytest.raises(ValueError, match="semaphore_priority_step=-1 is not accepted"):
        validate_app_settings(app.conf)
