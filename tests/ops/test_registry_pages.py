"""Issue 31: the registry forgets dynamic names nobody uses, and ``list`` (CLI and web page)
answers a page at a time."""

from __future__ import annotations

import json
import shlex
import time
import urllib.parse
from typing import Any

import pytest
import redis
from celery import Celery

from celery_semaphore.integration.config import APP_SETTINGS, validate_app_settings
from celery_semaphore.ops import registry, web

from .conftest import make_app, run_cli
from .test_cli import closed_port
from .test_web_app import request


def _dynamic(name: str) -> registry.TaskUse:
    return registry.TaskUse(name, "ops.tenant", 2, template="tenant:{tenant}")


def test_the_default_forget_after_is_the_settings_table_s() -> None:
    assert APP_SETTINGS["semaphore_registry_forget_after"][0] == registry.FORGET_AFTER


@pytest.mark.parametrize("value", [0, -1, "7d", True])
def test_a_bad_forget_after_stops_the_worker(value: Any) -> None:
    app = Celery("bad", set_as_current=False)
    app.conf.semaphore_registry_forget_after = value
    with pytest.raises((TypeError, ValueError), match="semaphore_registry_forget_after"):
        validate_app_settings(app.conf)


def test_prune_forgets_dynamic_names_unused_for_forget_after(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    registry.record(redis_client, key_prefix, [registry.TaskUse("fixed", "ops.one", 3)])
    registry.record(redis_client, key_prefix, [_dynamic("tenant:old"), _dynamic("tenant:new")])
    now = time.time()
    # "tenant:old" was last used an hour ago
    redis_client.zadd(registry.used_key(key_prefix), {"tenant:old": now - 3600})
    assert set(registry.read(redis_client, key_prefix)) == {"fixed", "tenant:old", "tenant:new"}
    listed = registry.read(redis_client, key_prefix, forget_after=600)
    assert set(listed) == {"fixed", "tenant:new"}  # not listed once past its time
    assert registry.prune(redis_client, key_prefix, 600) == 1
    assert set(registry.read(redis_client, key_prefix)) == {"fixed", "tenant:new"}
    # a fixed name (from a task's code) is never forgotten this way
    assert registry.prune(redis_client, key_prefix, 600, now=now + 10**6) == 1  # tenant:new
    assert set(registry.read(redis_client, key_prefix)) == {"fixed"}


def test_a_name_noted_again_is_kept(redis_client: redis.Redis, key_prefix: str) -> None:
    """A worker notes a name's use again after a tenth of forget_after: an active name is
    never forgotten, and a process does not write on every use."""
    use = _dynamic("tenant:busy")
    assert registry.note_used(redis_client, key_prefix, use, forget_after=1.0)
    assert not registry.note_used(redis_client, key_prefix, use, forget_after=1.0)  # too soon
    first = redis_client.zscore(registry.used_key(key_prefix), "tenant:busy")
    time.sleep(0.15)
    assert registry.note_used(redis_client, key_prefix, use, forget_after=1.0)
    again = redis_client.zscore(registry.used_key(key_prefix), "tenant:busy")
    assert first is not None
    assert again is not None
    assert again > first
    assert registry.prune(redis_client, key_prefix, 1.0) == 0


def test_forget_removes_the_use_too(redis_client: redis.Redis, key_prefix: str) -> None:
    registry.record(redis_client, key_prefix, [_dynamic("tenant:x")])
    assert registry.forget(redis_client, key_prefix, "tenant:x")
    assert redis_client.zcard(registry.used_key(key_prefix)) == 0


def test_page_by_name() -> None:
    entries = {n: registry.Known(n) for n in ["c", "a", "d", "b"]}
    assert [e.name for e in registry.page(entries, 2)[0]] == ["a", "b"]
    assert registry.page(entries, 2)[1] is True
    assert [e.name for e in registry.page(entries, 2, "b")[0]] == ["c", "d"]
    assert registry.page(entries, 2, "b")[1] is False
    assert [e.name for e in registry.page(entries, None, "a")[0]] == ["b", "c", "d"]
    assert registry.page(entries, 2, "zz") == ([], False)


@pytest.fixture
def many(redis_url: str, key_prefix: str, redis_client: redis.Redis) -> Celery:
    """An app with no tasks of its own, and 250 dynamic names in the registry."""
    uses = [_dynamic(f"tenant:{n:04d}") for n in range(250)]
    registry.record(redis_client, key_prefix, uses)
    return make_app(redis_url, key_prefix)


def _names(app: Celery, redis_client: redis.Redis, key_prefix: str) -> list[str]:
    """Every name ``list --no-scan`` knows, by name: the 250, and those of shared tasks other
    tests defined (every app has them)."""
    names = sorted(registry.known(redis_client, key_prefix, app, scan=False))
    assert {f"tenant:{n:04d}" for n in range(250)} <= set(names)
    return names


def test_list_shows_a_page_at_a_time(
    many: Celery, redis_client: redis.Redis, key_prefix: str
) -> None:
    names = _names(many, redis_client, key_prefix)
    first = run_cli(many, "list", "--no-scan", "--json")
    assert first.exit_code == 0, first.output
    assert [r["name"] for r in json.loads(first.stdout)] == names[:100]
    assert f"--after {shlex.quote(names[99])}" in first.stderr  # with --json, on stderr
    second = run_cli(many, "list", "--no-scan", "--json", "--after", names[99])
    assert [r["name"] for r in json.loads(second.stdout)] == names[100:200]
    last = run_cli(many, "list", "--no-scan", "--after", names[-61], "--limit", "60")
    assert last.exit_code == 0, last.output
    assert names[-1] in last.stdout
    assert "next page" not in last.stdout  # the last page
    everything = run_cli(many, "list", "--no-scan", "--json", "--limit", "0")
    assert [r["name"] for r in json.loads(everything.stdout)] == names
    text = run_cli(many, "list", "--no-scan", "--limit", "10")
    assert f"showing 10 of {len(names)} semaphores" in text.stdout


def test_the_web_page_lists_a_page_at_a_time(
    many: Celery, redis_client: redis.Redis, key_prefix: str
) -> None:
    names = _names(many, redis_client, key_prefix)
    port = closed_port()
    server, _ = web.start_server(many, port=port, scan=False)
    base = f"http://127.0.0.1:{port}/api/semaphores"
    try:
        status, _, body = request(base)
        assert status == 200
        data = json.loads(body)
        assert [r["name"] for r in data["semaphores"]] == names[:100]
        assert (data["total"], data["next"]) == (len(names), names[99])
        _, _, body = request(base + "?after=" + urllib.parse.quote(names[-51]))
        data = json.loads(body)
        assert [r["name"] for r in data["semaphores"]] == names[-50:]
        assert data["next"] is None
        _, _, body = request(base + "?limit=0")
        assert len(json.loads(body)["semaphores"]) == len(names)
        assert request(base + "?limit=-2")[0] == 400
    finally:
        server.shutdown()
        server.server_close()
