"""Rates and limits per key on ``@limited``: what a call resolves to, what the plan carries to
the body, and the errors for bad input (at decoration for static values and tables, per call
for a callable's result)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_semaphore import LimitedTask, Rate, limited
from celery_semaphore.integration.decorators import spec_of
from celery_semaphore.integration.targets import Plan, resolve


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("unit", broker="memory://", set_as_current=False)
    app.conf.semaphore_redis_url = "redis://127.0.0.1:6379/0"
    yield app
    app.close()


def plan(task: Any, *args: Any, **kwargs: Any) -> Plan:
    spec = spec_of(task)
    assert spec is not None
    return resolve(task, spec, args, kwargs, "celery")


def test_rate_strings_and_windows_reach_the_target(app: Celery) -> None:
    @app.task(shared=False)
    @limited("stripe", limit=10, rate="100/s")
    def charge(n: int) -> None: ...

    @app.task(shared=False)
    @limited("llm", limit=3, rate=["1000/h", "60/m"])
    def summarize(n: int) -> None: ...

    assert plan(charge, 1).targets[0].rates == (Rate(100, 1.0),)
    # sorted by period, whatever order they were given in
    assert plan(summarize, 1).targets[0].rates == (Rate(60, 60.0), Rate(1000, 3600.0))


def test_limit_table_picks_exact_then_most_specific_pattern_then_default(app: Celery) -> None:
    table = {
        "*": 5,
        "api:t*": 2,
        "api:trial-*": 1,
        "api:acme": 50,
        "api:tr?al-x": 9,
        "api:trial-x?": 7,
    }

    @app.task(shared=False)
    @limited("api:{tenant}", limit=table)
    def call(tenant: str) -> None: ...

    tenants = ("acme", "trial-x", "trial-xy", "trial-y", "tx", "zz")
    limits = {t: plan(call, t).targets[0].limit for t in tenants}
    # "api:trial-x?" has more fixed characters than "api:trial-*"; "api:tr?al-x" as many as
    # "api:trial-*", which was given first
    assert limits == {"acme": 50, "trial-x": 1, "trial-xy": 7, "trial-y": 1, "tx": 2, "zz": 5}


def test_limit_and_rate_from_callables_are_checked_per_call(app: Celery) -> None:
    tiers = {"gold": 20, "free": 2}

    @app.task(shared=False)
    @limited(
        "llm:{customer}",
        limit=lambda a: tiers[a["tier"]],
        rate=lambda a: "10/s" if a["tier"] == "gold" else ["1/s", "30/m"],
    )
    def by_tier(customer: str, tier: str) -> None: ...

    gold = plan(by_tier, "acme", "gold").targets[0]
    free = plan(by_tier, "bob", "free").targets[0]
    assert (gold.name, gold.limit, gold.rates) == ("llm:acme", 20, (Rate(10, 1.0),))
    assert (free.name, free.limit, free.rates) == ("llm:bob", 2, (Rate(1, 1.0), Rate(30, 60.0)))

    @app.task(shared=False)
    @limited("k:{c}", limit=lambda a: a["value"])
    def bad_limit(c: str, value: Any) -> None: ...

    with pytest.raises(TypeError, match=r"task .*bad_limit: semaphore 'k:1': limit \(from "):
        plan(bad_limit, "1", "3")
    with pytest.raises(ValueError, match=r"semaphore 'k:1': limit .*=0 is not accepted"):
        plan(bad_limit, "1", 0)

    @app.task(shared=False)
    @limited("r:{c}", limit=4, rate=lambda a: a["rate"])
    def bad_rate(c: str, rate: Any) -> None: ...

    with pytest.raises(ValueError, match=r"semaphore 'r:1': rate \(from .*\)='9/q' is not"):
        plan(bad_rate, "1", "9/q")


def test_rate_table_by_key(app: Celery) -> None:
    @app.task(shared=False)
    @limited("geo:{t}", limit=5, rate={"geo:vip": None, "*": "2/s"})
    def geo(t: str) -> None: ...

    assert plan(geo, "vip").targets[0].rates == ()
    assert plan(geo, "x").targets[0].rates == (Rate(2, 1.0),)


def test_the_plan_carries_rates_to_the_body(app: Celery) -> None:
    @app.task(shared=False)
    @limited("w:{t}", limit=3, rate=lambda a: ["2/s", "5/10s"])
    def work(t: str) -> None: ...

    spec = spec_of(work)
    assert spec is not None
    sent = plan(work, "a")
    assert Plan.from_wire(spec, sent.to_wire()) == sent
    # a plan from a worker before rates (four columns) reads as no rate
    old = {**sent.to_wire(), "targets": [row[:4] for row in sent.to_wire()["targets"]]}
    rebuilt = Plan.from_wire(spec, old)
    assert rebuilt is not None
    assert rebuilt.targets[0].rates == ()


def test_limited_task_class_takes_a_rate(app: Celery) -> None:
    class Api(LimitedTask):
        name = "unit.api"
        semaphore_name = "api"
        semaphore_limit = 4
        semaphore_rate = "3/s"

        def run(self) -> None: ...

    task = app.register_task(Api())
    assert plan(task).targets[0].rates == (Rate(3, 1.0),)


@pytest.mark.parametrize(
    ("name", "kwargs", "error", "text"),
    [
        ("api", {"limit": 3, "rate": "10/x"}, ValueError, "semaphore 'api': rate='10/x' is not"),
        ("api", {"limit": 3, "rate": "0/s"}, ValueError, "rate='0/s' is not accepted"),
        ("api", {"limit": 3, "rate": "1/2d"}, ValueError, "below one start per day"),
        ("api", {"limit": 8, "weight": 6, "rate": "5/s"}, ValueError, "weight=6 exceeds the count"),
        (["a", "b"], {"limit": 2, "rate": "1/s"}, ValueError, "several semaphores at once"),
        ("api:{c}", {"limit": {"api:1": 2}}, ValueError, "needs a default entry '*'"),
        ("api:{c}", {"limit": {"api:1": 0, "*": 1}}, ValueError, "limit['api:1']=0 is not"),
        ("api:{c}", {"limit": {"": 1, "*": 1}}, ValueError, "key '' is not accepted"),
        ("api:{c}", {"limit": 2, "rate": {"*": "x"}}, ValueError, "rate['*']='x' is not"),
        ("fixed", {"limit": {"fixed:*": 2, "*": 1}}, ValueError, "is for one name template"),
        (["a", "b:{c}"], {"limit": {"a": {"*": 1}, "b:{c}": 2}}, TypeError, "for a fixed name"),
    ],
)
def test_bad_rates_and_tables_fail_at_decoration(
    app: Celery, name: Any, kwargs: dict[str, Any], error: type[Exception], text: str
) -> None:
    with pytest.raises(error) as caught:

        @app.task(shared=False)
        @limited(name, **kwargs)
        def task(c: int = 0) -> None: ...

    message = str(caught.value)
    assert text in message, message
    assert "on tests.unit.test_spec_per_key.test_bad_rates_and_tables_fail_at_decoration" in message


def test_semaphore_rates_overrides_code_by_name_template_and_pattern(app: Celery) -> None:
    @app.task(shared=False)
    @limited("geo:{t}", limit=5, rate="2/s")
    def geo2(t: str) -> None: ...

    assert plan(geo2, "a").targets[0].rates == (Rate(2, 1.0),)
    app.conf.semaphore_rates = {"geo:vip": None, "geo:b*": "9/m"}
    assert plan(geo2, "vip").targets[0].rates == ()  # its own entry: no rate
    assert plan(geo2, "bob").targets[0].rates == (Rate(9, 60.0),)  # the pattern
    assert plan(geo2, "x").targets[0].rates == (Rate(2, 1.0),)  # no key: the code's
    # the template's entry comes before any pattern
    app.conf.semaphore_rates = {"geo:*": "9/m", "geo:{t}": ["4/s", "100/h"]}
    assert plan(geo2, "x").targets[0].rates == (Rate(4, 1.0), Rate(100, 3600.0))


def test_worker_start_refuses_bad_semaphore_rates(app: Celery) -> None:
    from celery_semaphore.integration.signals import check_app

    @app.task(shared=False)
    @limited("api", limit=8, weight=3)
    def heavy() -> None: ...

    @app.task(shared=False)
    @limited(["db", "cache"], limit=2)
    def both() -> None: ...

    app.conf.semaphore_rates = {"api": "1/x"}
    with pytest.raises(ValueError, match=r"semaphore_rates\['api'\]='1/x' is not accepted"):
        check_app(app)
    app.conf.semaphore_rates = {"api": "2/s"}
    with pytest.raises(ValueError, match=r"weight=3 exceeds the count of the rate window 2/s"):
        check_app(app)
    app.conf.semaphore_rates = {"d*": "2/s"}
    with pytest.raises(ValueError, match=r"takes several semaphores at once"):
        check_app(app)
    app.conf.semaphore_rates = {"api": "5/s"}
    check_app(app)


def test_an_unhashable_rate_from_a_callable_is_named(app: Celery) -> None:
    @app.task(shared=False)
    @limited("u:{c}", limit=4, rate=lambda a: ["10/s", ["x"]])
    def odd(c: str) -> None: ...

    with pytest.raises(
        TypeError, match=r"semaphore 'u:1': rate \(from .*<lambda>\)=\['x'\] \(list"
    ):
        plan(odd, "1")


def test_throttled_in_an_app_with_the_semaphore_off_reports_nothing(app: Celery) -> None:
    from celery_semaphore import throttled

    app.conf.semaphore_enabled = False

    @app.task(shared=False)
    @limited("svc", limit=2, adaptive=True)
    def call() -> int:
        return len(throttled(retry_after=1.0))

    assert call.apply().get() == 0
    app.conf.semaphore_enabled = True
    with pytest.raises(RuntimeError, match=r"throttled\(\) was called outside the body"):
        throttled()
