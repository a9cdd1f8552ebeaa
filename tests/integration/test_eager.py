"""Eager mode, ``apply()`` and direct calls: no worker, the caller blocks for a bounded time.

In-process (no worker): each test builds its own Celery app pointing ``semaphore_redis_url`` at
the test Redis with a key prefix of its own.  A busy semaphore must block up to
``semaphore_eager_timeout`` and then raise ``SemaphoreTimeout``, never run the body without a
permit, and never recurse (a ``Retry`` in eager mode would call ``apply()`` again at once).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery import Celery
from celery._state import _set_task_join_will_block, task_join_will_block

from celery_semaphore import LimitedTask, Semaphore, SemaphoreTimeout, current_permits, limited

pytestmark = pytest.mark.timeout(60)

NAME = "eager"
LIMIT = 2
EAGER_TIMEOUT = 0.3


@dataclass
class Counter:
    """An independent count of bodies inside, and what each body saw of its permit."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    now: int = 0
    max: int = 0
    ran: list[str] = field(default_factory=list)
    permits: dict[str, int] = field(default_factory=dict)

    def body(self, tag: str, seconds: float) -> str:
        with self.lock:
            self.now += 1
            self.max = max(self.max, self.now)
            self.ran.append(tag)
        self.permits[tag] = len(current_permits())
        time.sleep(seconds)
        with self.lock:
            self.now -= 1
        return tag


@dataclass
class Eager:
    app: Celery
    sem: Semaphore
    counter: Counter
    job: Any  # bound @limited task
    job_unbound: Any  # unbound @limited task
    klass: Any  # LimitedTask subclass
    via_base: Any  # @app.task(base=LimitedTask, ...)
    patient: Any  # @limited with max_wait, which wins over semaphore_eager_timeout

    def fill(self) -> list[Any]:
        """Take every unit, as another worker would."""
        held = [self.sem.acquire(blocking=False) for _ in range(LIMIT)]
        assert all(held)
        return held


def make_app(redis_url: str, prefix: str, **conf: Any) -> Eager:
    # shared=False below: a shared task would be added to every app made later, and the
    # first one registered (another test's) would win there
    app = Celery(f"eager-{prefix}", set_as_current=False)
    app.conf.update(
        {
            "task_always_eager": True,
            "task_eager_propagates": True,
            "semaphore_redis_url": redis_url,
            "semaphore_key_prefix": prefix,
            "semaphore_eager_timeout": EAGER_TIMEOUT,
            **conf,
        }
    )
    counter = Counter()

    @app.task(bind=True, shared=False)
    @limited(NAME, limit=LIMIT)
    def job(self: Any, tag: str, seconds: float = 0.0) -> str:
        return counter.body(tag, seconds)

    @app.task(shared=False)
    @limited(NAME, limit=LIMIT)
    def job_unbound(tag: str, seconds: float = 0.0) -> str:
        return counter.body(tag, seconds)

    class Klass(LimitedTask):
        name = "eager.klass"
        semaphore_name = NAME
        semaphore_limit = LIMIT

        def run(self, tag: str, seconds: float = 0.0) -> str:
            return counter.body(tag, seconds)

    klass = app.register_task(Klass())

    @app.task(shared=False, base=LimitedTask, semaphore_name=NAME, semaphore_limit=LIMIT)
    def via_base(tag: str, seconds: float = 0.0) -> str:
        return counter.body(tag, seconds)

    @app.task(shared=False)
    @limited(NAME, limit=LIMIT, max_wait=0.05)
    def patient(tag: str) -> str:
        return counter.body(tag, 0.0)

    sem = Semaphore(NAME, LIMIT, redis=redis_url, key_prefix=prefix)
    # finalize (and bind every task) now, not racily in the callers' threads
    app.finalize(auto=True)
    tasks = [app.tasks[t.name] for t in (job, job_unbound, klass, via_base, patient)]
    return Eager(app, sem, counter, *tasks)


@pytest.fixture
def eager(redis_url: str, key_prefix: str) -> Iterator[Eager]:
    e = make_app(redis_url, key_prefix)
    yield e
    e.app.close()


def _forms(e: Eager) -> list[Any]:
    return [e.job, e.job_unbound, e.klass, e.via_base]


def _count_apply(monkeypatch: pytest.MonkeyPatch, task: Any) -> list[int]:
    """Count calls of ``task.apply`` (an eager Retry would call it again, recursively)."""
    calls: list[int] = []
    original = task.apply

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(task, "apply", counting)
    return calls


@pytest.mark.parametrize("form", ["job", "job_unbound", "klass", "via_base"])
def test_delay_runs_holding_a_permit_and_releases(eager: Eager, form: str) -> None:
    task = getattr(eager, form)
    seen: list[Any] = []
    original = eager.counter.body

    def body(tag: str, seconds: float) -> str:
        seen.extend(eager.sem.holders())
        return original(tag, seconds)

    eager.counter.body = body  # type: ignore[method-assign]
    result = task.delay("a")
    assert result.get() == "a"
    assert eager.counter.ran == ["a"]
    assert eager.counter.permits == {"a": 1}
    (holder,) = seen
    assert holder.owner["task_id"] == result.id
    assert holder.owner["task"] == task.name
    assert eager.sem.holders() == []
    assert eager.sem.waiters() == []


@pytest.mark.parametrize("form", ["job", "job_unbound", "klass", "via_base"])
def test_full_semaphore_blocks_then_times_out_without_running(
    eager: Eager, form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = getattr(eager, form)
    calls = _count_apply(monkeypatch, task)
    held = eager.fill()
    started = time.monotonic()
    with pytest.raises(SemaphoreTimeout) as info:
        task.delay("x")
    waited = time.monotonic() - started
    assert EAGER_TIMEOUT <= waited < EAGER_TIMEOUT + 1.5
    assert calls == [1]  # one apply(): no eager Retry recursion
    assert eager.counter.ran == []  # the body never ran without a permit
    assert info.value.name == NAME
    assert NAME in str(info.value)
    assert eager.sem.waiters() == []  # the place in line was withdrawn
    assert sorted(h.token for h in eager.sem.holders()) == sorted(p.token for p in held)
    for p in held:
        p.release()
    assert task.delay("y").get() == "y"  # and it works again once there is room


def test_full_semaphore_without_propagation_gives_a_failed_result(
    redis_url: str, key_prefix: str
) -> None:
    e = make_app(redis_url, key_prefix, task_eager_propagates=False)
    e.fill()
    result = e.job.delay("x")
    assert result.failed()
    assert isinstance(result.result, SemaphoreTimeout)
    assert e.counter.ran == []
    e.app.close()


def test_task_max_wait_wins_over_eager_timeout(redis_url: str, key_prefix: str) -> None:
    e = make_app(redis_url, key_prefix, semaphore_eager_timeout=30.0)
    e.fill()
    started = time.monotonic()
    with pytest.raises(SemaphoreTimeout):
        e.patient.delay("x")
    assert time.monotonic() - started < 2.0  # max_wait=0.05, not 30 s
    assert e.counter.ran == []
    e.app.close()


def test_semaphore_enabled_false_bypasses(redis_url: str, key_prefix: str) -> None:
    e = make_app(redis_url, key_prefix, semaphore_enabled=False)
    held = e.fill()
    for task in _forms(e):
        assert task.delay("free").get() == "free"
    assert e.counter.ran == ["free"] * 4
    assert e.counter.permits == {"free": 0}  # ran without a permit
    # the blockers' permits are untouched
    assert sorted(h.token for h in e.sem.holders()) == sorted(p.token for p in held)
    e.app.close()


def test_apply_without_always_eager(redis_url: str, key_prefix: str) -> None:
    e = make_app(redis_url, key_prefix, task_always_eager=False, task_eager_propagates=False)
    for task in _forms(e):
        assert task.apply(("a",)).get() == "a"
    assert e.counter.permits == {"a": 1}
    assert e.sem.holders() == []
    e.fill()
    for task in _forms(e):
        result = task.apply(("x",))
        assert result.failed()
        assert isinstance(result.result, SemaphoreTimeout)
        with pytest.raises(SemaphoreTimeout):
            task.apply(("y",), throw=True)
    assert e.counter.ran == ["a"] * 4
    e.app.close()


@pytest.mark.parametrize("form", ["job", "job_unbound", "klass", "via_base"])
def test_direct_call_acquires(eager: Eager, form: str) -> None:
    task = getattr(eager, form)
    seen: list[Any] = []
    original = eager.counter.body

    def body(tag: str, seconds: float) -> str:
        seen.extend(eager.sem.holders())
        return original(tag, seconds)

    eager.counter.body = body  # type: ignore[method-assign]
    assert task("direct") == "direct"
    assert len(seen) == 1  # held while the body ran
    assert eager.counter.permits == {"direct": 1}
    assert eager.sem.holders() == []
    held = eager.fill()
    with pytest.raises(SemaphoreTimeout):
        task("blocked")
    assert eager.counter.ran == ["direct"]
    for p in held:
        p.release()


def test_eager_calls_from_many_threads_respect_the_limit(eager: Eager) -> None:
    """Six threads, each calling .delay() eagerly: at most LIMIT bodies at once."""
    e = make_app(
        eager.app.conf.semaphore_redis_url,
        eager.app.conf.semaphore_key_prefix,
        semaphore_eager_timeout=20.0,
    )
    forms = _forms(e)

    def call(i: int) -> str:
        # Task.apply() flips a process-wide "join would block" flag (denied_join_result), so
        # another thread's get() may see it: read the eager result without get()
        result = forms[i % 4].delay(f"c{i}", 0.15)
        assert result.successful()
        return str(result.result)

    blocks = task_join_will_block()
    try:
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(call, i) for i in range(12)]
            done = sorted(f.result(timeout=30) for f in futures)
    finally:
        _set_task_join_will_block(blocks)  # the flag is not thread-safe; restore it
    assert done == sorted(f"c{i}" for i in range(12))
    assert e.counter.max == LIMIT
    assert e.counter.now == 0
    assert e.sem.holders() == []
    e.app.close()
