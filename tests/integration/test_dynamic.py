"""Names and weights from the task's arguments, on a real prefork worker: each customer's
semaphore is limited independently of the others (an independent counter per customer), and a
weight computed per call is counted in units and refused above the limit."""

from __future__ import annotations

import pytest

from celery_semaphore import Semaphore
from celery_semaphore.ops import registry
from tests.ops.conftest import run_cli

from . import proj
from .helpers import holders, max_inside, ran, semaphore
from .workers import Env, start_worker, wait_until

pytestmark = pytest.mark.timeout(90)


def test_per_customer_limits_hold_independently(env: Env) -> None:
    worker = start_worker(env, pool="prefork", concurrency=8)
    app = env.client_app()
    try:
        customers = ["acme", "globex", None]
        results = [
            app.send_task(proj.per_customer.name, (c, f"{c}-{i}", 0.3))
            for i in range(6)
            for c in customers
        ]
        assert sorted(r.get(timeout=60) for r in results) == sorted(
            f"{c}-{i}" for i in range(6) for c in customers
        )
    finally:
        worker.stop()
    # the limit (2) held for each customer, and each reached it ...
    for customer in customers:
        assert max_inside(env, f"cust-{customer}") == env.limit, customer
    # ... at the same time as the others: one shared semaphore would have capped this at 2
    assert max_inside(env, "all-customers") >= 2 * env.limit
    names = ["cust:acme", "cust:globex", "cust:~none"]  # None is not the string "None"
    for name in names:
        assert holders(env, name) == []
        assert semaphore(env, name).waiters() == []
    assert holders(env, "cust:{customer}") == []  # the template itself is no semaphore
    # the registry learned the names that were used, with their template
    known = registry.read(env.redis(), env.prefix)
    for name in names:
        assert name in known, sorted(known)
        assert known[name].tasks == {proj.per_customer.name: (env.limit, 1)}
    # and the operator's `celery semaphore list` shows them, without scanning Redis
    app = env.client_app()
    try:
        listed = run_cli(app, "list", "--no-scan", "--json")
    finally:
        app.close()
    assert listed.exit_code == 0, listed.output
    for name in names:
        assert f'"{name}"' in listed.stdout, listed.stdout
    raw = env.redis().hget(registry.registry_key(env.prefix), "cust:acme")
    assert raw is not None
    assert b'"template": "cust:{customer}"' in raw


def test_weight_from_the_arguments(env: Env) -> None:
    worker = start_worker(env, pool="threads", concurrency=6)
    app = env.client_app()
    try:
        units = [1, 3, 2, 2, 4, 1, 3, 1, 2]
        results = [
            app.send_task(proj.weighted.name, (f"w{i}", u, 0.15)) for i, u in enumerate(units)
        ]
        too_heavy = app.send_task(proj.weighted.name, ("heavy", 5))
        assert sorted(r.get(timeout=60) for r in results) == sorted(
            f"w{i}" for i in range(len(units))
        )
        with pytest.raises(ValueError, match="weight=5 exceeds the limit of semaphore 'units'"):
            too_heavy.get(timeout=30)
    finally:
        worker.stop()
    assert max_inside(env, "units") == 4  # units in use: never above the limit, and reached
    wait_until(lambda: holders(env, "units") == [], 10, what="no holders")
    assert "heavy" not in ran(env)


def test_hash_tag_setting_puts_every_semaphore_in_one_slot(env: Env) -> None:
    env.extra = {"semaphore_hash_tag": "shared"}
    worker = start_worker(env, pool="threads", concurrency=4)
    app = env.client_app()
    try:
        results = [
            app.send_task(proj.per_customer.name, (c, f"{c}{i}", 0.05))
            for i in range(4)
            for c in "xy"
        ]
        assert len([r.get(timeout=30) for r in results]) == 8
    finally:
        app.close()
        worker.stop()
    keys = [k.decode() for k in env.redis().scan_iter(match=f"{env.prefix}:{{*")]
    assert keys, "the semaphores' keys"
    assert all(k.startswith(f"{env.prefix}:{{shared}}:") for k in keys), keys
    assert max_inside(env, "cust-x") == env.limit
    assert max_inside(env, "cust-y") == env.limit
    # operator tools read the same keys (the client app has the same setting)
    sem = Semaphore(
        "cust:x", env.limit, redis=env.redis_url, key_prefix=env.prefix, hash_tag="shared"
    )
    app = env.client_app()
    try:
        with sem.hold(timeout=5) as permit:
            shown = run_cli(app, "show", "cust:x", "--json")
    finally:
        app.close()
    assert shown.exit_code == 0, shown.output
    assert permit.token in shown.stdout
