"""``celery semaphore set-limit PATTERN N``: a glob pattern changes every known semaphore it
matches (from the app, the registry the workers wrote, and Redis) and only those, each printed
and audited; several matches ask first unless --yes; a pattern matching nothing changes nothing.
Also: ``list`` shows the limit a pattern key of ``semaphore_limits`` gives."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
from celery import Celery
from click.testing import Result

from celery_semaphore import limited
from celery_semaphore.ops import audit, registry
from celery_semaphore.ops.cli import EXIT_CANCELLED, EXIT_NOT_FOUND
from tests.conftest import SemaphoreFactory

from .conftest import Cli, make_app, run_cli

#: every semaphore of the test, and its code limit
CODE = {"llm:a": 3, "llm:b": 3, "llm:c": 4, "llm:d": 5, "db": 2}
LLM = ["llm:a", "llm:b", "llm:c", "llm:d"]


@pytest.fixture
def app(
    redis_url: str, key_prefix: str, redis_client: redis.Redis, make_semaphore: SemaphoreFactory
) -> Iterator[Celery]:
    """llm:a, llm:b and db from the app's tasks; llm:c only in the registry (a dynamic name a
    worker used); llm:d only in Redis (found by SCAN)."""
    app = make_app(redis_url, key_prefix)

    @app.task(name="pat.a", shared=False)
    @limited("llm:a", limit=3)
    def a() -> None: ...

    @app.task(name="pat.b", shared=False)
    @limited("llm:b", limit=3)
    def b() -> None: ...

    @app.task(name="pat.db", shared=False)
    @limited("db", limit=2)
    def db() -> None: ...

    use = registry.TaskUse("llm:c", "pat.model", 4, template="llm:{model}")
    registry.record(redis_client, key_prefix, [use], node="w1@test")
    permit = make_semaphore("llm:d", 5).acquire(blocking=False)  # leaves state in Redis
    assert permit is not None
    permit.release()
    yield app
    app.close()


@pytest.fixture
def cli(app: Celery) -> Cli:
    def run(*args: str, input: str | None = None) -> Result:
        return run_cli(app, *args, input=input)

    return run


def overrides(make_semaphore: SemaphoreFactory) -> dict[str, int | None]:
    return {n: make_semaphore(n, CODE[n]).inspect().limit_override for n in CODE}


def test_a_pattern_sets_every_match_and_only_those(
    cli: Cli, make_semaphore: SemaphoreFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    result = cli("set-limit", "llm:*", "1", "--yes")
    assert result.exit_code == 0, result.output
    assert "pattern 'llm:*' matches 4 semaphore(s): 'llm:a', 'llm:b', 'llm:c', 'llm:d'" in (
        result.stdout
    )
    for name in LLM:
        assert f"semaphore {name!r}: limit set to 1 (runtime override" in result.stdout
    assert "'db'" not in result.stdout
    assert overrides(make_semaphore) == {**dict.fromkeys(LLM, 1), "db": None}
    for name in LLM:
        [entry] = audit.read(redis_client, key_prefix, name)
        assert (entry["action"], entry["detail"]["limit"]) == ("set-limit", 1)
    assert audit.read(redis_client, key_prefix, "db") == []
    # obeyed: a client declaring limit 3 gets one permit of llm:a
    sem = make_semaphore("llm:a", 3)
    permit = sem.acquire(blocking=False)
    assert permit is not None
    assert sem.acquire(blocking=False) is None
    permit.release()

    cleared = cli("set-limit", "llm:[ab]", "--clear", "--yes")
    assert cleared.exit_code == 0, cleared.output
    assert cleared.stdout.count("runtime override cleared") == 2
    assert overrides(make_semaphore) == {
        "llm:a": None,
        "llm:b": None,
        "llm:c": 1,
        "llm:d": 1,
        "db": None,
    }


def test_several_matches_ask_first(cli: Cli, make_semaphore: SemaphoreFactory) -> None:
    refused = cli("set-limit", "llm:?", "2", input="n\n")
    assert refused.exit_code == EXIT_CANCELLED, refused.output
    assert "Set the limit to 2 on these 4 semaphores?" in refused.output
    assert "set-limit cancelled (use --yes to skip the question)" in refused.stderr
    no_input = cli("set-limit", "llm:?", "2")  # no terminal: nothing confirms
    assert no_input.exit_code == EXIT_CANCELLED, no_input.output
    assert set(overrides(make_semaphore).values()) == {None}

    confirmed = cli("set-limit", "llm:?", "2", input="y\n")
    assert confirmed.exit_code == 0, confirmed.output
    assert overrides(make_semaphore) == {**dict.fromkeys(LLM, 2), "db": None}


def test_one_match_and_dry_run_do_not_ask(cli: Cli, make_semaphore: SemaphoreFactory) -> None:
    dry = cli("set-limit", "llm:*", "2", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "dry run: would set the limit to 2 on 4 semaphore(s); nothing changed" in dry.stdout
    assert set(overrides(make_semaphore).values()) == {None}

    one = cli("set-limit", "d?", "7")
    assert one.exit_code == 0, one.output
    assert "pattern 'd?' matches 1 semaphore(s): 'db'" in one.stdout
    assert overrides(make_semaphore)["db"] == 7


def test_a_pattern_matching_nothing_changes_nothing(
    cli: Cli, make_semaphore: SemaphoreFactory, key_prefix: str
) -> None:
    result = cli("set-limit", "gpu-*", "2", "--yes")
    assert result.exit_code == EXIT_NOT_FOUND, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(
        f"celery semaphore: error: pattern 'gpu-*' matches no known semaphore under key "
        f"prefix {key_prefix!r}"
    )
    assert "nothing changed" in line
    assert set(overrides(make_semaphore).values()) == {None}


def test_an_exact_name_with_a_wildcard_character_is_that_semaphore(
    cli: Cli, make_semaphore: SemaphoreFactory
) -> None:
    permit = make_semaphore("llm:*", 3).acquire(blocking=False)
    assert permit is not None
    permit.release()
    result = cli("set-limit", "llm:*", "2")
    assert result.exit_code == 0, result.output
    assert "pattern" not in result.stdout
    assert make_semaphore("llm:*", 3).inspect().limit_override == 2
    assert set(overrides(make_semaphore).values()) == {None}


def test_list_shows_the_limit_a_pattern_key_gives(
    redis_url: str, key_prefix: str, app: Celery
) -> None:
    app.conf.semaphore_limits = {"llm:*": 8, "llm:a": 6}
    result = run_cli(app, "list", "--json")
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    got = {n: (rows[n]["limit"], rows[n]["source"]) for n in CODE}
    assert got == {
        "llm:a": (6, "setting"),
        "llm:b": (8, "setting"),
        "llm:c": (8, "setting"),
        "llm:d": (8, "setting"),
        "db": (2, "code"),
    }


def test_semaphores_only_in_redis_are_found_under_the_apps_hash_tag(
    redis_url: str, key_prefix: str, make_semaphore: SemaphoreFactory
) -> None:
    """With ``semaphore_hash_tag``, a semaphore's keys are ``{tag}:n:name``: `list` finds one
    that only Redis knows, `show` takes its exact name, and a pattern matches it."""
    app = make_app(redis_url, key_prefix, semaphore_hash_tag="billing")
    try:
        for name in ("pay:eu", "pay:us"):
            permit = make_semaphore(name, 2, hash_tag="billing").acquire(blocking=False)
            assert permit is not None  # leaves state in Redis, under the tag
        listed = run_cli(app, "list")
        assert listed.exit_code == 0, listed.output
        assert "pay:eu" in listed.stdout
        assert "pay:us" in listed.stdout
        shown = run_cli(app, "show", "pay:eu")
        assert shown.exit_code == 0, shown.output
        assert "in use: 1 of" in shown.stdout, shown.stdout
        changed = run_cli(app, "set-limit", "pay:*", "1", "--yes")
        assert changed.exit_code == 0, changed.output
        for name in ("pay:eu", "pay:us"):
            assert make_semaphore(name, 2, hash_tag="billing").inspect().limit_override == 1
    finally:
        app.close()
