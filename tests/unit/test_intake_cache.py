"""What the intake of a limited task remembers between calls (issue 18 item 3), and that it
never serves a stale answer: a plan fixed per call is reused while the settings stay the
same and worked out again when they change; a semaphore is looked up again under a changed
key prefix; the owner metadata names the process it is made in, after a fork too."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_semaphore import limited
from celery_semaphore.core.rates import Rate
from celery_semaphore.integration import targets
from celery_semaphore.integration.decorators import spec_of
from celery_semaphore.integration.delivery import host_owner
from celery_semaphore.integration.heartbeat import heartbeat
from celery_semaphore.integration.locks import semaphore_for
from celery_semaphore.integration.targets import Plan, resolve


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("intake", broker="memory://", set_as_current=False)
    app.conf.semaphore_redis_url = "redis://127.0.0.1:6379/0"
    yield app
    app.close()


def plan(task: Any, *args: Any, queue: str | None = "celery", **kwargs: Any) -> Plan:
    spec = spec_of(task)
    assert spec is not None
    return resolve(task, spec, args, kwargs, queue)


def test_a_fixed_plan_is_reused_until_a_setting_changes(app: Celery) -> None:
    @app.task(name="i.charge", shared=False)
    @limited("pay", limit=9, queue_limits={"bulk": 2})
    def charge() -> None: ...

    first = plan(charge)
    assert plan(charge) is first  # remembered
    assert (first.targets[0].limit, first.partition) == (9, "celery")
    bulk = plan(charge, queue="bulk")  # another partition: its own plan
    assert bulk is not first
    assert bulk.targets[0].partition_cap == 2
    app.conf.semaphore_limits = {"pay": 4}
    app.conf.semaphore_queue_limits = {"pay": {"bulk": 1}}
    app.conf.semaphore_queue_weights = {"pay": {"bulk": 3}}
    app.conf.semaphore_rates = {"pay": "5/s"}
    again = plan(charge, queue="bulk")
    assert again.targets[0].limit == 4
    assert again.targets[0].partition_cap == 1
    assert again.partition_weight == 3
    assert again.targets[0].rates == (Rate(5, 1.0),)
    assert plan(charge).targets[0].limit == 4


def test_a_plan_that_depends_on_the_call_is_not_reused(app: Celery) -> None:
    @app.task(name="i.api", shared=False)
    @limited("api:{customer}", limit=3)
    def api(customer: str) -> None: ...

    a, b = plan(api, "acme"), plan(api, "globex")
    assert (a.targets[0].name, b.targets[0].name) == ("api:acme", "api:globex")


def test_partitions_beyond_the_table_are_still_resolved(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(targets, "MAX_FIXED_PLANS", 2)

    @app.task(name="i.bulk", shared=False)
    @limited("bulk", limit=5, queue_limits={"q3": 1})
    def bulk() -> None: ...

    plans = [plan(bulk, queue=f"q{n}") for n in range(5)]
    assert [p.partition for p in plans] == [f"q{n}" for n in range(5)]
    assert plans[3].targets[0].partition_cap == 1
    assert plan(bulk, queue="q0") is plans[0]  # remembered
    assert plan(bulk, queue="q4") is not plans[4]  # past the table: worked out again


def test_semaphore_for_follows_a_changed_key_prefix(app: Celery) -> None:
    one = semaphore_for(app, "intake-a", 2, 30.0)
    try:
        assert semaphore_for(app, "intake-a", 2, 30.0) is one
        app.conf.semaphore_key_prefix = "intake-other"
        other = semaphore_for(app, "intake-a", 2, 30.0)
        try:
            assert other is not one
            assert other.key_prefix == "intake-other"
        finally:
            heartbeat.unwatch(other)
    finally:
        heartbeat.unwatch(one)


def test_host_owner_names_the_process_after_a_fork() -> None:
    here = host_owner("t", "task", "node")
    assert here["pid"] == os.getpid()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it sees, and leave without running pytest's exit
        try:
            os.write(write, json.dumps(host_owner("t", "task", "node")).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        with os.fdopen(read) as f:
            child = json.loads(f.read())
    finally:
        os.waitpid(pid, 0)
    assert child["pid"] == pid != here["pid"]
    assert (child["machine"], child["pidns"]) == (here["machine"], here["pidns"])
