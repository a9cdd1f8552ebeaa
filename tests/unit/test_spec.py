"""Building a LimitSpec and resolving calls to targets: names and weights from the task's
arguments, partitions, per-partition caps and weights, and the errors for bad input (at
decoration time when the value is static, at call time when it comes from the call)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import pytest
from celery import Celery

from celery_semaphore import LimitedTask, limited
from celery_semaphore.core.keys import SemaphoreKeys
from celery_semaphore.integration.config import validate_app_settings
from celery_semaphore.integration.decorators import spec_of
from celery_semaphore.integration.spec import QUEUE, LimitSpec
from celery_semaphore.integration.targets import Plan, resolve
from celery_semaphore.integration.templates import NONE_TEXT


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("unit", broker="memory://", set_as_current=False)
    app.conf.semaphore_redis_url = "redis://127.0.0.1:6379/0"
    yield app
    app.close()


def plan(task: Any, *args: Any, queue: str | None = "celery", **kwargs: Any) -> Plan:
    spec = spec_of(task)
    assert spec is not None
    return resolve(task, spec, args, kwargs, queue)


# -- names from arguments ---------------------------------------------------------------------


def test_template_name_takes_positional_and_keyword_arguments(app: Celery) -> None:
    @app.task(bind=True, shared=False)
    @limited("api:{customer_id}", limit=5)
    def call(self: Any, customer_id: Any, payload: str = "") -> None: ...

    assert plan(call, 7).targets[0].name == "api:7"
    assert plan(call, customer_id="acme").targets[0].name == "api:acme"
    assert plan(call, "x", payload="p").targets[0].name == "api:x"
    target = plan(call, 7).targets[0]
    assert (target.limit, target.weight, target.template) == (5, 1, "api:{customer_id}")


def test_template_on_an_unbound_task_and_defaults(app: Celery) -> None:
    @app.task(shared=False)
    @limited("{region}:{kind}", limit=2)
    def job(kind: str, region: str = "eu") -> None: ...

    assert plan(job, "pdf").targets[0].name == "eu:pdf"
    assert plan(job, "pdf", "us").targets[0].name == "us:pdf"


def test_none_is_distinct_from_the_string_none(app: Celery) -> None:
    @app.task(shared=False)
    @limited("c:{cid}", limit=1)
    def job(cid: Any) -> None: ...

    names = {
        plan(job, None).targets[0].name,
        plan(job, "None").targets[0].name,
        plan(job, NONE_TEXT).targets[0].name,
        plan(job, "~").targets[0].name,
        plan(job, "").targets[0].name,
    }
    assert len(names) == 5
    assert plan(job, None).targets[0].name == f"c:{NONE_TEXT}"


def test_very_long_values_give_distinct_safe_keys(app: Celery) -> None:
    @app.task(shared=False)
    @limited("c:{cid}", limit=1)
    def job(cid: Any) -> None: ...

    a = plan(job, "x" * 5000 + "a").targets[0].name
    b = plan(job, "x" * 5000 + "b").targets[0].name
    ka, kb = SemaphoreKeys.for_name(a, "p"), SemaphoreKeys.for_name(b, "p")
    assert ka.state != kb.state
    assert len(ka.state) < 400
    assert len(kb.state) < 400


def test_callable_name_gets_the_bound_arguments(app: Celery) -> None:
    seen: list[dict[str, Any]] = []

    def name(arguments: Any) -> str:
        seen.append(dict(arguments))
        return f"tenant-{arguments['tenant']}"

    @app.task(bind=True, shared=False)
    @limited(name, limit=3)
    def job(self: Any, tenant: str, n: int = 1) -> None: ...

    assert plan(job, "t1").targets[0].name == "tenant-t1"
    assert seen == [{"tenant": "t1", "n": 1}]  # no self


def test_callable_name_must_return_a_string(app: Celery) -> None:
    @app.task(shared=False)
    @limited(lambda a: None, limit=3)  # type: ignore[arg-type,return-value]
    def job(x: int) -> None: ...

    with pytest.raises(TypeError, match=r"the name callable .* returned NoneType None"):
        plan(job, 1)


def test_unknown_placeholder_fails_at_decoration(app: Celery) -> None:
    with pytest.raises(ValueError, match=r"uses \{customer\}, which is not a parameter"):

        @app.task(bind=True, shared=False)
        @limited("api:{customer}", limit=5)
        def call(self: Any, customer_id: int) -> None: ...


def test_self_is_not_a_placeholder(app: Celery) -> None:
    with pytest.raises(ValueError, match=r"accepted placeholders: \{x\}"):

        @app.task(bind=True, shared=False)
        @limited("api:{self}", limit=5)
        def call(self: Any, x: int) -> None: ...


def test_kwargs_functions_accept_any_placeholder_and_fail_clearly_at_call(app: Celery) -> None:
    @app.task(shared=False)
    @limited("api:{customer_id}", limit=5)
    def call(**kwargs: Any) -> None: ...

    assert plan(call, customer_id=3).targets[0].name == "api:3"
    with pytest.raises(ValueError, match="no argument customer_id in this call"):
        plan(call, other=1)


def test_bad_templates(app: Celery) -> None:
    with pytest.raises(ValueError, match=re.escape("name='api:{0}' is not accepted")):
        LimitSpec.build("api:{0}", 2, {}, where="w")
    with pytest.raises(ValueError, match=re.escape("name='api:{' is not accepted")):
        LimitSpec.build("api:{", 2, {}, where="w")
    assert LimitSpec.build("api:{{literal}}", 2, {}, where="w").members[0].dynamic_name is False


def test_limited_task_class_checks_placeholders(app: Celery) -> None:
    with pytest.raises(ValueError, match=r"uses \{nope\}"):

        class Bad(LimitedTask):
            semaphore_name = "gpu:{nope}"
            semaphore_limit = 2

            def run(self, video_id: int) -> None: ...

    class Good(LimitedTask):
        semaphore_name = "gpu:{video_id}"
        semaphore_limit = 2

        def run(self, video_id: int) -> None: ...

    task = app.register_task(Good())
    assert plan(task, 9).targets[0].name == "gpu:9"


def test_semaphore_limits_apply_to_the_name_then_the_template(app: Celery) -> None:
    @app.task(shared=False)
    @limited("api:{cid}", limit=5)
    def call(cid: str) -> None: ...

    app.conf.semaphore_limits = {"api:{cid}": 8, "api:big": 20}
    assert plan(call, "small").targets[0].limit == 8
    assert plan(call, "big").targets[0].limit == 20


# -- weights --------------------------------------------------------------------------------


def decorate(*args: Any, **kwargs: Any) -> None:
    """``@limited(*args, **kwargs)`` on a task function ``job`` of this module."""

    def job() -> None: ...

    limited(*args, **kwargs)(job)


#: how errors name the task function ``job`` above
JOB = re.escape(f"on {__name__}.decorate.<locals>.job: ")


def test_static_weight_above_the_limit_fails_at_decoration() -> None:
    with pytest.raises(
        ValueError,
        match=r"@limited\('x'\) " + JOB + r"weight=3 exceeds the limit of semaphore 'x' "
        r"\(2, from limit=\); use a weight from 1 to 2$",
    ):
        decorate("x", limit=2, weight=3)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"limit": 0}, ValueError, "semaphore 'api': limit=0 is not accepted: use an int >= 1"),
        (
            {"limit": "5"},
            TypeError,
            "semaphore 'api': limit must be an int >= 1, got str '5'",
        ),
        (
            {"limit": 5, "weight": 0},
            ValueError,
            "semaphore 'api': weight=0 is not accepted: use an int >= 1",
        ),
        (
            {"limit": {"api": 0}},
            ValueError,
            "semaphore 'api': limit=0 is not accepted: use an int >= 1",
        ),
        (
            {"limit": 5, "lease_ttl": -1},
            ValueError,
            "lease_ttl=-1 is not accepted: use a finite number of seconds > 0",
        ),
        (
            {"limit": 5, "queue_limits": {"bulk": 0}},
            ValueError,
            "queue_limits['bulk']=0 is not accepted: use an int >= 1",
        ),
        ({"limit": 5, "partition": 3}, TypeError, "partition must be a template str"),
    ],
)
def test_spec_errors_name_the_task_the_semaphore_and_the_value(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        decorate("api", **kwargs)
    assert str(info.value).startswith(f"@limited('api') on {__name__}.decorate.<locals>.job: ")
    assert message in str(info.value)


def test_spec_errors_of_a_limited_task_class_name_the_class() -> None:
    with pytest.raises(ValueError, match="limit=0") as info:

        class Bad(LimitedTask):
            semaphore_name = "gpu"
            semaphore_limit = 0

            def run(self) -> None: ...

    assert str(info.value) == (
        "LimitedTask test_spec_errors_of_a_limited_task_class_name_the_class.<locals>.Bad: "
        "semaphore 'gpu': limit=0 is not accepted: use an int >= 1"
    )


def test_a_literal_brace_in_a_name_is_told_to_be_doubled(app: Celery) -> None:
    with pytest.raises(ValueError, match="not a parameter") as info:

        @app.task(shared=False)
        @limited("api:{v2}:{region}", limit=5)
        def call(region: str) -> None: ...

    message = str(info.value)
    assert "call: name='api:{v2}:{region}' uses {v2}, which is not a parameter of the task" in (
        message
    )
    assert message.endswith("for literal braces, double them: name='api:{{v2}}:{region}'")

    @app.task(shared=False)
    @limited("api:{{v2}}:{region}", limit=5)  # what it suggests works
    def fixed(region: str) -> None: ...

    assert plan(fixed, "eu").targets[0].name == "api:{v2}:eu"


def test_dynamic_weight(app: Celery) -> None:
    @app.task(shared=False)
    @limited("gpu", limit=4, weight=lambda a: a["gpus"])
    def train(gpus: int) -> None: ...

    assert plan(train, 3).targets[0].weight == 3
    with pytest.raises(ValueError, match="weight=5 exceeds the limit of semaphore 'gpu'"):
        plan(train, 5)
    with pytest.raises(ValueError, match="is not accepted: use an int >= 1"):
        plan(train, 0)
    with pytest.raises(TypeError, match="must be an int >= 1, got str"):
        plan(train, "2")


# -- partitions, caps and weights -------------------------------------------------------------


def test_partition_is_the_queue_by_default(app: Celery) -> None:
    @app.task(shared=False)
    @limited("api", limit=4, queue_limits={"bulk": 3}, queue_weights={"interactive": 3})
    def call(x: int) -> None: ...

    assert spec_of(call).partition is QUEUE  # type: ignore[union-attr]
    bulk = plan(call, 1, queue="bulk")
    assert (bulk.partition, bulk.partition_weight, bulk.targets[0].partition_cap) == (
        "bulk",
        1,
        3,
    )
    fast = plan(call, 1, queue="interactive")
    assert (fast.partition, fast.partition_weight, fast.targets[0].partition_cap) == (
        "interactive",
        3,
        None,
    )
    assert plan(call, 1, queue=None).partition == ""


def test_partition_template_callable_and_none(app: Celery) -> None:
    @app.task(shared=False)
    @limited("api", limit=4, partition="{tenant_id}")
    def by_tenant(tenant_id: str, x: int = 0) -> None: ...

    @app.task(shared=False)
    @limited("api", limit=4, partition=lambda a: "big" if a["x"] > 10 else None)
    def by_size(x: int) -> None: ...

    @app.task(shared=False)
    @limited("api", limit=4, partition=None)
    def one_line(x: int) -> None: ...

    assert plan(by_tenant, "t9", queue="bulk").partition == "t9"
    assert plan(by_size, 50).partition == "big"
    assert plan(by_size, 5).partition == ""
    assert plan(one_line, 5, queue="bulk").partition == ""
    with pytest.raises(ValueError, match=r"partition='\{tenant\}' uses \{tenant\}"):

        @app.task(shared=False)
        @limited("api", limit=4, partition="{tenant}")
        def bad(tenant_id: str) -> None: ...


def test_long_partitions_are_shortened_distinctly(app: Celery) -> None:
    @app.task(shared=False)
    @limited("api", limit=4, partition="{tenant}")
    def job(tenant: str) -> None: ...

    a, b = plan(job, "t" * 3000 + "a").partition, plan(job, "t" * 3000 + "b").partition
    assert a != b
    assert len(a.encode()) <= 200
    assert len(b.encode()) <= 200
    assert plan(job, "short").partition == "short"


def test_partition_callable_must_return_a_string(app: Celery) -> None:
    @app.task(shared=False)
    @limited("api", limit=4, partition=lambda a: 3)
    def job(x: int) -> None: ...

    with pytest.raises(TypeError, match="the partition callable returned int 3"):
        plan(job, 1)


def test_settings_override_code_caps_and_weights(app: Celery) -> None:
    @app.task(shared=False)
    @limited("api", limit=10, queue_limits={"bulk": 3})
    def call(x: int) -> None: ...

    app.conf.semaphore_queue_limits = {"api": {"bulk": 5, "batch": 2}}
    app.conf.semaphore_queue_weights = {"api": {"bulk": 7}}
    p = plan(call, 1, queue="bulk")
    assert (p.targets[0].partition_cap, p.partition_weight) == (5, 7)
    assert plan(call, 1, queue="batch").targets[0].partition_cap == 2


def test_weight_above_a_cap(app: Celery) -> None:
    with pytest.raises(
        ValueError, match=r"weight=3 exceeds the cap of partition 'bulk' on semaphore 'api' \(2,"
    ):
        decorate("api", limit=5, weight=3, queue_limits={"bulk": 2})

    @app.task(shared=False)
    @limited("api", limit=5, weight=lambda a: a["w"], queue_limits={"bulk": 2})
    def job(w: int) -> None: ...

    with pytest.raises(ValueError, match="exceeds the cap of partition 'bulk'"):
        plan(job, 3, queue="bulk")
    assert plan(job, 3, queue="other").targets[0].weight == 3


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"queue_limits": [3]}, TypeError, "queue_limits must be a dict of partition"),
        ({"queue_limits": {"bulk": 0}}, ValueError, r"queue_limits\['bulk'\]=0 is not accepted"),
        ({"queue_limits": {3: 1}}, TypeError, "queue_limits keys must be partition"),
        (
            {"queue_weights": {"a": 1001}},
            ValueError,
            r"queue_weights\['a'\]=1001 is not accepted: use an int from 1 to 1000",
        ),
        ({"queue_weights": {"a": 1.5}}, TypeError, r"queue_weights\['a'\] must be an int"),
        ({"partition": 3}, TypeError, "partition must be a template str"),
        ({"weight": "2"}, TypeError, "weight must be an int >= 1"),
        ({"partitions": "x"}, TypeError, "unknown option.*partitions.*queue_limits"),
    ],
)
def test_bad_options_fail_at_decoration(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match) as info:
        decorate("api", limit=5, **options)
    assert "decorate.<locals>.job: " in str(info.value)


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"semaphore_queue_limits": {"api": {"bulk": 0}}}, r"semaphore_queue_limits\['api'\]"),
        ({"semaphore_queue_limits": {"api": 3}}, r"semaphore_queue_limits\['api'\] must be a dict"),
        ({"semaphore_queue_limits": ["api"]}, "must be a dict of semaphore name"),
        ({"semaphore_queue_weights": {"api": {"x": 0}}}, r"semaphore_queue_weights\['api'\]"),
        ({"semaphore_queue_weights": {"": {"x": 1}}}, "semaphore_queue_weights key"),
    ],
)
def test_bad_settings_fail_validation(app: Celery, settings: dict[str, Any], match: str) -> None:
    app.conf.update(settings)
    with pytest.raises((TypeError, ValueError), match=match):
        validate_app_settings(app.conf)


def test_good_settings_validate(app: Celery) -> None:
    app.conf.semaphore_queue_limits = {"api": {"bulk": 3}}
    app.conf.semaphore_queue_weights = {"api": {"interactive": 3}}
    out = validate_app_settings(app.conf)
    assert out["semaphore_queue_limits"] == {"api": {"bulk": 3}}
    assert out["semaphore_queue_weights"] == {"api": {"interactive": 3}}


def test_limited_task_class_options(app: Celery) -> None:
    class Fair(LimitedTask):
        semaphore_name = "gpu"
        semaphore_limit = 4
        semaphore_partition = "{team}"
        semaphore_queue_limits: ClassVar[dict[str, int]] = {"ml": 2}
        semaphore_queue_weights: ClassVar[dict[str, int]] = {"web": 5}

        def run(self, team: str) -> None: ...

    task = app.register_task(Fair())
    p = plan(task, "ml")
    assert (p.partition, p.targets[0].partition_cap) == ("ml", 2)
    assert plan(task, "web").partition_weight == 5

    class OneLine(LimitedTask):
        semaphore_name = "gpu"
        semaphore_limit = 4
        semaphore_partition = None

        def run(self, team: str) -> None: ...

    assert plan(app.register_task(OneLine()), "ml", queue="q").partition == ""


def test_a_plan_travels_from_the_gate_to_the_body_without_resolving_the_call_again(
    app: Celery,
) -> None:
    """The gate resolves a call's targets in the consumer; the body rebuilds them from the
    directive (``Plan.to_wire``/``from_wire``) instead of calling the name and weight
    functions again (issue 17)."""
    calls: list[int] = []

    def weight(arguments: Mapping[str, Any]) -> int:
        calls.append(1)
        return int(arguments["gpus"])

    @app.task(shared=False)
    @limited(
        ["gpu:{site}", "licence"],
        limit={"gpu:{site}": 4, "licence": 10},
        weight=weight,
        queue_limits={"bulk": 3},
    )
    def train(site: str, gpus: int) -> None: ...

    spec = spec_of(train)
    assert spec is not None
    sent = plan(train, "eu", 2, queue="bulk")
    resolved = len(calls)
    assert resolved > 0
    wire = json.loads(json.dumps(sent.to_wire()))  # what a prefork child receives
    assert Plan.from_wire(spec, wire) == sent
    assert [t.name for t in sent.targets] == ["gpu:eu", "licence"]
    assert len(calls) == resolved  # the weight function was not called again
    assert Plan.from_wire(spec, {**wire, "targets": wire["targets"][:1]}) is None
