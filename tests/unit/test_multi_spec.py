"""Several semaphores per task: a list of names, or stacked @limited (spec level)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_semaphore import limited
from celery_semaphore.integration.decorators import spec_of
from celery_semaphore.integration.targets import Plan, resolve


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("unit-multi", broker="memory://", set_as_current=False)
    yield app
    app.close()


def plan(task: Any, *args: Any, **kwargs: Any) -> Plan:
    spec = spec_of(task)
    assert spec is not None
    return resolve(task, spec, args, kwargs, "q")


def test_a_list_of_names_with_one_limit_or_a_dict(app: Celery) -> None:
    @app.task(shared=False)
    @limited(["db", "stripe"], limit=3)
    def both(x: int) -> None: ...

    @app.task(shared=False)
    @limited(["db", "stripe:{account}"], limit={"db": 10, "stripe:{account}": 2}, weight=2)
    def mixed(account: str) -> None: ...

    assert [(t.name, t.limit, t.weight) for t in plan(both, 1).targets] == [
        ("db", 3, 1),
        ("stripe", 3, 1),
    ]
    assert [(t.name, t.limit, t.weight) for t in plan(mixed, "acme").targets] == [
        ("db", 10, 2),
        ("stripe:acme", 2, 2),
    ]


def test_stacked_decorators_combine(app: Celery) -> None:
    @app.task(bind=True, shared=False)
    @limited("db", limit=10, lease_ttl=120)
    @limited("stripe:{account}", limit=2, queue_limits={"bulk": 1})
    def charge(self: Any, account: str) -> None: ...

    spec = spec_of(charge)
    assert spec is not None
    assert [m.name for m in spec.members] == ["stripe:{account}", "db"]
    assert spec.options == {"lease_ttl": 120}
    targets = plan(charge, "acme").targets
    assert [t.name for t in targets] == ["stripe:acme", "db"]


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: limited([], limit=2), ValueError, r"name=\[\] is not accepted"),
        (lambda: limited(["a", "a"], limit=2), ValueError, "'a' is named twice"),
        (
            lambda: limited(["a", "b"], limit={"a": 2}),
            ValueError,
            "no entry for 'b'; give limit=<int> for every semaphore",
        ),
        (
            lambda: limited(["a"], limit={"a": 2, "c": 1}),
            ValueError,
            "'c' is not one of the names",
        ),
    ],
)
def test_bad_lists(build: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match) as info:
        build()(lambda: None)  # errors are raised when a function is decorated, naming it
    assert ".<lambda>: " in str(info.value)


def test_stacked_conflicts(app: Celery) -> None:
    with pytest.raises(TypeError, match=r"lease_ttl=30.0 here but lease_ttl=120.0 on the other"):

        @app.task(shared=False)
        @limited("db", limit=10, lease_ttl=30)
        @limited("stripe", limit=2, lease_ttl=120)
        def a(x: int) -> None: ...

    with pytest.raises(ValueError, match="'db' is named twice"):

        @app.task(shared=False)
        @limited("db", limit=10)
        @limited("db", limit=2)
        def b(x: int) -> None: ...

    with pytest.raises(TypeError, match="a task waits in one partition"):

        @app.task(shared=False)
        @limited("db", limit=10, partition=None)
        @limited("stripe", limit=2, partition="{x}")
        def c(x: int) -> None: ...


def test_lock_arguments_for_one_and_for_several(app: Celery) -> None:
    from celery_semaphore.integration.locks import lock_kwargs

    @app.task(shared=False)
    @limited(["db", "stripe"], limit=3, queue_limits={"q": 2})
    def both(x: int) -> None: ...

    @app.task(shared=False)
    @limited("db", limit=3, weight=2)
    def one(x: int) -> None: ...

    assert lock_kwargs(plan(both, 1)) == {
        "partition": "q",
        "partition_caps": {"db": 2, "stripe": 2},
        "partition_weight": 1,
    }
    assert lock_kwargs(plan(one, 1)) == {
        "weight": 2,
        "partition": "q",
        "partition_cap": None,
        "partition_weight": 1,
    }
