"""The CLI and the metrics against two real prefork ``celery worker`` nodes (2 children each,
limit 2, 6 s leases so the heartbeat runs every 2 s), each serving ``/metrics``.

The CLI runs through click's CliRunner for the tests' client app; the workers record their
semaphores in the registry at start (checked here; test_cli.py shows an app that knows the
semaphores from the registry alone).  Concurrency
is counted by an independent counter in the task bodies (tests/integration/proj.Body).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families

from celery_semaphore.ops import registry
from celery_semaphore.ops.audit import operator
from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix
from tests.integration import proj
from tests.integration.helpers import holders, max_inside, ran, reset_bookkeeping, semaphore
from tests.integration.workers import (
    Env,
    Worker,
    start_worker,
    stop_workers,
    wait_ready,
    wait_until,
)

from .conftest import run_cli
from .test_cli import closed_port

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


@dataclass
class Fleet:
    env: Env
    nodes: list[Worker]
    metrics_urls: list[str]


@pytest.fixture(scope="module")
def fleet(redis_server: RedisServer) -> Iterator[Fleet]:
    base = Env(redis_url=redis_server.url(0), broker_url=redis_server.url(0), limit=2, lease=6.0)
    ports = [closed_port(), closed_port()]
    envs = [
        replace(base, extra={"semaphore_metrics_port": p, "semaphore_metrics_address": "127.0.0.1"})
        for p in ports
    ]
    nodes: list[Worker] = []
    try:
        for name, env in zip("ab", envs, strict=True):
            nodes.append(start_worker(env, concurrency=2, name=name, wait=False))
        for node in nodes:
            wait_ready(base, node, 60)
        yield Fleet(base, nodes, [f"http://127.0.0.1:{p}/metrics" for p in ports])
    finally:
        stop_workers(nodes)
        client = redis_server.client(0)
        delete_prefix(client, base.prefix)
        client.delete(base.queue)
        client.close()


@pytest.fixture
def env(fleet: Fleet) -> Iterator[Env]:
    yield fleet.env
    wait_until(lambda: not holders(fleet.env), 20, what="no holders after the test")
    reset_bookkeeping(fleet.env)


@pytest.fixture
def client_app(env: Env) -> Iterator[Celery]:
    app = env.client_app()
    yield app
    app.close()


def cli_json(app: Celery, *args: str) -> Any:
    result = run_cli(app, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def batch(app: Celery, tag: str, n: int = 8, seconds: float = 0.3) -> None:
    results = [app.send_task(proj.work.name, (f"{tag}{i}", seconds)) for i in range(n)]
    assert sorted(r.get(timeout=60) for r in results) == sorted(f"{tag}{i}" for i in range(n))


def test_list_shows_what_the_workers_registered(fleet: Fleet, client_app: Celery) -> None:
    rows = {r["name"]: r for r in cli_json(client_app, "list")}
    main, one = rows["main"], rows["one"]
    assert (main["limit"], main["source"], one["limit"]) == (2, "code", 1)
    assert "registry" in main["found_in"]
    assert main["recorded_by"] in {node.name for node in fleet.nodes}
    # what the workers wrote at start, read without the app
    recorded = registry.read(fleet.env.redis(), fleet.env.prefix)
    assert recorded["main"].tasks[proj.work.name] == (2, 1)
    assert recorded["one"].tasks[proj.work_one.name] == (1, 1)


def test_set_limit_takes_effect_on_running_workers(env: Env, client_app: Celery) -> None:
    batch(client_app, "before")
    assert max_inside(env) == 2  # four worker slots: the limit of 2 is reached

    reset_bookkeeping(env)
    result = run_cli(client_app, "set-limit", "main", "1")
    assert result.exit_code == 0, result.output
    try:
        batch(client_app, "during")
        assert max_inside(env) == 1  # no restart, no other change: the workers obey at once
        assert sorted(ran(env)) == sorted(f"during{i}" for i in range(8))
        main = {r["name"]: r for r in cli_json(client_app, "list")}["main"]
        assert (main["limit"], main["source"], main["code"]) == (1, "override", 2)
    finally:
        cleared = run_cli(client_app, "set-limit", "main", "--clear")
    assert cleared.exit_code == 0, cleared.output

    reset_bookkeeping(env)
    batch(client_app, "after")
    assert max_inside(env) == 2


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(fleet: Fleet, name: str, **labels: str) -> float:
    """``name`` summed over both workers' exporters (series whose labels include ``labels``)."""
    out = 0.0
    for url in fleet.metrics_urls:
        for (sample, sample_labels), value in scrape(url).items():
            if sample == name and set(labels.items()) <= set(sample_labels):
                out += value
    return out


def test_show_explain_top_release_and_reset_on_live_tasks(
    fleet: Fleet, env: Env, client_app: Celery
) -> None:
    lost_before = total(fleet, "celery_semaphore_lease_lost_total", semaphore="main")
    sleepers = [client_app.send_task(proj.sleeper.name, (f"s{i}", 8.0)) for i in range(2)]
    wait_until(lambda: len(holders(env)) == 2, 30, what="both sleepers hold a permit")
    waiter = client_app.send_task(proj.work.name, ("w", 0.05))
    sem = semaphore(env)
    wait_until(
        lambda: any(w.owner.get("task_id") == waiter.id for w in sem.waiters()),
        30,
        what="the third task waits in line",
    )

    shown = cli_json(client_app, "show", "main")
    assert sorted(h["task_id"] for h in shown["holder_list"]) == sorted(s.id for s in sleepers)
    assert {h["host"] for h in shown["holder_list"]} <= {n.name for n in fleet.nodes}
    assert all(h["task"] == proj.sleeper.name for h in shown["holder_list"])
    assert [w["task_id"] for w in shown["waiter_list"]] == [waiter.id]

    [why] = cli_json(client_app, "explain", waiter.id)
    assert (why["state"], why["waiter"]["position"], why["ahead"]) == ("waiting", 0, [])
    assert (why["free"], why["needed"], why["cap"]["limit"]) == (0, 1, 2)
    assert why["estimate"] is not None
    [held] = cli_json(client_app, "explain", sleepers[0].id)
    assert held["state"] == "holding"

    top = run_cli(client_app, "top", "--iterations", "1", "--no-scan")
    line = next(x for x in top.stdout.splitlines() if x.startswith("main"))
    assert "[" + "#" * 30 + "]" in line
    assert "2/2 in use  1 waiting" in line

    # a forced release frees the unit for the waiter at once, while the sleeper runs on
    released = run_cli(client_app, "release", "main", "--task-id", sleepers[0].id, "--yes")
    assert released.exit_code == 0, released.output
    assert waiter.get(timeout=20) == "w"
    assert not sleepers[0].ready()
    # the sleeper's heartbeat (every 2 s) finds its permit gone, logs it (naming the semaphore
    # and the task, in the worker's own log) and counts it
    # (and says what happened: an operator forced it, not an expired lease)
    lost = f"[semaphore=main task={sleepers[0].id}] permit RELEASED (token "
    wait_until(
        lambda: any(lost in n.log() for n in fleet.nodes),
        15,
        what="the heartbeat reports the permit released by the operator",
    )
    who = operator()
    assert any(f"forced by {who['user']}@{who['host']}" in n.log() for n in fleet.nodes)
    assert not any("permit LOST" in n.log() for n in fleet.nodes)
    wait_until(
        lambda: (
            total(fleet, "celery_semaphore_lease_lost_total", semaphore="main") == lost_before + 1
        ),
        10,
        what="lease_lost counted once",
    )

    reset = run_cli(client_app, "reset", "main", "--yes")
    assert reset.exit_code == 0, reset.output
    assert "released 1 holder(s)" in reset.stdout
    assert holders(env) == []
    actions = [a["action"] for a in cli_json(client_app, "audit", "main")]
    assert actions[:2] == ["reset", "release"]
    for s in sleepers:  # leave the worker slots free for the next test
        s.get(timeout=30)


def test_metrics_scraped_from_live_workers(fleet: Fleet, env: Env, client_app: Celery) -> None:
    def counts() -> dict[str, float]:
        return {
            "acquired": total(fleet, "celery_semaphore_acquired_total", semaphore="main"),
            "waited": total(fleet, "celery_semaphore_wait_seconds_count", semaphore="main"),
            "held": total(fleet, "celery_semaphore_hold_seconds_count", semaphore="main"),
            "waits": total(fleet, "celery_semaphore_waits_total", semaphore="main"),
        }

    before = counts()
    batch(client_app, "m")
    wait_until(lambda: counts()["held"] >= before["held"] + 8, 10, what="8 more releases")
    after = counts()
    assert after["acquired"] - before["acquired"] == 8
    assert after["waited"] - before["waited"] == 8
    assert after["held"] - before["held"] == 8
    assert after["waits"] > before["waits"]  # 4 slots, limit 2: some had to wait
    for url in fleet.metrics_urls:  # the gauges are fleet-wide: every exporter agrees
        samples = scrape(url)
        assert samples[("celery_semaphore_limit", (("semaphore", "main"),))] == 2
        assert samples[("celery_semaphore_limit", (("semaphore", "one"),))] == 1
        assert samples[("celery_semaphore_in_use", (("semaphore", "main"),))] == 0
        assert samples[("celery_semaphore_redis_up", ())] == 1
    hold_sum = total(fleet, "celery_semaphore_hold_seconds_sum", semaphore="main")
    assert hold_sum >= 8 * 0.3  # each body slept 0.3 s holding its permit
