"""Keys of ``semaphore_limits``, ``semaphore_queue_limits`` and ``semaphore_queue_weights`` as
exact names, name templates and glob patterns: which key wins, what is refused at start, and
which keys a worker warns about (they match no semaphore of its tasks)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_semaphore import limited
from celery_semaphore.integration import config
from celery_semaphore.integration.decorators import spec_of
from celery_semaphore.integration.patterns import Lookup, could_match, specificity
from celery_semaphore.integration.signals import check_app, unmatched_keys, warn_unmatched_keys
from celery_semaphore.integration.targets import Plan, resolve


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("patterns", broker="memory://", set_as_current=False)
    app.conf.semaphore_redis_url = "redis://127.0.0.1:6379/0"
    yield app
    app.close()


def plan(task: Any, *args: Any, queue: str | None = "celery", **kwargs: Any) -> Plan:
    spec = spec_of(task)
    assert spec is not None
    return resolve(task, spec, args, kwargs, queue)


def tasks(app: Celery) -> tuple[Any, Any, Any]:
    @app.task(name="p.chat", shared=False)
    @limited("llm:{model}", limit=9)
    def chat(model: str) -> None: ...

    @app.task(name="p.db", shared=False)
    @limited("db-main", limit=9)
    def db() -> None: ...

    @app.task(name="p.api", shared=False)
    @limited("api:{customer}", limit=9, queue_limits={"bulk": 9})
    def api(customer: str) -> None: ...

    return chat, db, api


# -- precedence -------------------------------------------------------------------------------


def test_exact_name_then_template_then_most_specific_pattern(app: Celery) -> None:
    chat, db, _ = tasks(app)
    app.conf.semaphore_limits = {
        "llm:*": 5,  # 4 literal characters
        "*": 1,  # matches everything, least specific
        "llm:gpt-*": 4,  # 8 literal characters: beats llm:*
        "llm:gpt-?": 3,  # 8 literal characters too: a tie, the key given first wins
        "llm:gpt-4o": 2,  # the exact name beats every pattern
        "db-[a-m]ain": 7,
    }
    limits = {m: plan(chat, m).targets[0].limit for m in ("gpt-4o", "gpt-5", "claude")}
    assert limits == {"gpt-4o": 2, "gpt-5": 4, "claude": 5}
    assert plan(db).targets[0].limit == 7
    # the template beats a pattern, and the concrete name beats the template
    app.conf.semaphore_limits = {"llm:*": 5, "llm:{model}": 6, "llm:x": 8}
    assert [plan(chat, m).targets[0].limit for m in ("x", "y")] == [8, 6]
    # no key matches: the code's limit
    app.conf.semaphore_limits = {"gpu*": 1}
    assert plan(chat, "x").targets[0].limit == 9


def test_tie_between_equally_specific_patterns_goes_to_the_first_given() -> None:
    assert specificity("llm:gpt-*") == specificity("llm:gpt-?") == 8
    assert Lookup({"llm:gpt-*": 1, "llm:gpt-?": 2}).first(("llm:gpt-4",)) == 1
    assert Lookup({"llm:gpt-?": 2, "llm:gpt-*": 1}).first(("llm:gpt-4",)) == 2
    # case matters, as in names
    assert Lookup({"LLM:*": 1}).first(("llm:x",)) is None


def test_queue_limits_and_weights_take_patterns_key_by_key(app: Celery) -> None:
    _, _, api = tasks(app)
    app.conf.semaphore_queue_limits = {
        "api:*": {"bulk": 2, "batch": 3},
        "api:acme": {"bulk": 1},  # exact: beats the pattern for bulk only
    }
    app.conf.semaphore_queue_weights = {"api:*": {"interactive": 5}, "api:a*": {"bulk": 2}}
    acme_bulk, acme_batch = plan(api, "acme", queue="bulk"), plan(api, "acme", queue="batch")
    assert acme_bulk.targets[0].partition_cap == 1
    assert acme_batch.targets[0].partition_cap == 3  # from the pattern, key by key
    assert plan(api, "globex", queue="bulk").targets[0].partition_cap == 2
    assert plan(api, "acme", queue="other").targets[0].partition_cap is None
    assert plan(api, "acme", queue="interactive").partition_weight == 5
    assert acme_bulk.partition_weight == 2
    assert plan(api, "globex", queue="bulk").partition_weight == 1


def test_a_change_of_the_setting_is_seen_at_once(app: Celery) -> None:
    chat, _, _ = tasks(app)
    app.conf.semaphore_limits = {"llm:*": 5}
    assert plan(chat, "x").targets[0].limit == 5
    app.conf.semaphore_limits = {"llm:?": 4}
    assert plan(chat, "x").targets[0].limit == 4
    assert plan(chat, "xy").targets[0].limit == 9


def test_pattern_limits_are_checked_against_static_weights_at_start(app: Celery) -> None:
    @app.task(name="p.heavy", shared=False)
    @limited("gpu-a", limit=8, weight=4)
    def heavy() -> None: ...

    app.conf.semaphore_limits = {"gpu-*": 2}
    with pytest.raises(ValueError, match="semaphore_limits"):
        check_app(app)
    app.conf.semaphore_limits = {"gpu-*": 4}
    app.conf.semaphore_queue_limits = {"gpu-?": {"bulk": 3}}
    with pytest.raises(ValueError, match="bulk"):
        check_app(app)


# -- keys refused at start ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "value", "error", "words"),
    [
        ("semaphore_limits", {"": 3}, ValueError, "semaphore_limits key '' is not accepted"),
        (
            "semaphore_limits",
            {"llm:[z-a]*": 3},
            ValueError,
            "semaphore_limits key 'llm:[z-a]*' is not accepted: the pattern can match no name",
        ),
        ("semaphore_queue_limits", {3: {"bulk": 1}}, TypeError, "semaphore_queue_limits keys"),
        (
            "semaphore_queue_weights",
            {"x[9-0]": {"bulk": 1}},
            ValueError,
            "semaphore_queue_weights key 'x[9-0]'",
        ),
    ],
)
def test_a_key_that_can_match_nothing_is_refused(
    app: Celery, setting: str, value: Any, error: type[Exception], words: str
) -> None:
    app.conf[setting] = value
    with pytest.raises(error) as info:
        config.validate_app_settings(app.conf)
    assert words in str(info.value)
    assert "glob pattern ('llm:*'" in str(info.value)  # says what is accepted


# -- could a key name a semaphore? --------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("db-main", True),  # a static name
        ("llm:{model}", True),  # a template, as written
        ("llm:gpt-4", True),  # a name the template makes
        ("llm:*", True),
        ("*:gpt-4", True),  # a pattern matching names the template makes
        ("l?m:*", True),
        ("[kl]lm:x", True),
        ("db-*", True),
        ("lm:*", False),  # no name the template makes starts with "lm:"
        ("[ab]lm:x", False),
        ("db-mian", False),
        ("db-main*x", False),
        ("llm", False),  # the template has text after "llm"
        ("*.json", True),  # "llm:a.json" is a name the template makes
        ("x*", False),
    ],
)
def test_could_match(key: str, expected: bool) -> None:
    assert could_match(key, ["db-main"], ["llm:{model}"]) is expected


def test_a_template_with_text_after_its_placeholder() -> None:
    assert could_match("q:*:slow", [], ["q:{name}:slow"])
    assert could_match("q:a:slow", [], ["q:{name}:slow"])
    assert not could_match("q:a:fast", [], ["q:{name}:slow"])
    assert not could_match("*:fast", [], ["q:{name}:slow"])


# -- the warning at worker start -----------------------------------------------------------------


def test_unmatched_keys_are_listed_with_a_guess(app: Celery) -> None:
    tasks(app)
    app.conf.semaphore_limits = {"db-mian": 2, "llm:*": 3, "llm:gpt-4": 4, "nothing-alike": 1}
    app.conf.semaphore_queue_limits = {"api:acme": {"bulk": 1}, "apu:*": {"bulk": 1}}
    app.conf.semaphore_queue_weights = {"db-main": {"bulk": 2}}
    limited_tasks = [(n, s) for n, s in check_app(app) if n.startswith("p.")]
    assert unmatched_keys(app, limited_tasks) == [
        "semaphore_limits key 'db-mian' (did you mean 'db-main'?)",
        "semaphore_limits key 'nothing-alike'",
        "semaphore_queue_limits key 'apu:*' (did you mean 'api:{customer}'?)",
    ]


def test_one_warning_lists_them(app: Celery, caplog: pytest.LogCaptureFixture) -> None:
    tasks(app)
    app.conf.semaphore_limits = {"db-mian": 2, "llm:*": 3}
    app.conf.semaphore_queue_weights = {"dbmain": {"bulk": 2}}
    limited_tasks = [(n, s) for n, s in check_app(app) if n.startswith("p.")]
    with caplog.at_level(logging.WARNING, logger="celery_semaphore"):
        warn_unmatched_keys(app, limited_tasks)
    # the configuration's warnings only: a heartbeat thread another test left in this
    # process may log about its own semaphore meanwhile
    warnings = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == "celery_semaphore.config"
    ]
    assert len(warnings) == 1, caplog.text
    text = warnings[0].getMessage()
    assert "semaphore_limits key 'db-mian' (did you mean 'db-main'?)" in text
    assert "semaphore_queue_weights key 'dbmain' (did you mean 'db-main'?)" in text
    assert "llm:*" not in text


def test_no_warning_when_every_key_fits(app: Celery, caplog: pytest.LogCaptureFixture) -> None:
    tasks(app)
    app.conf.semaphore_limits = {"llm:*": 3, "db-main": 2, "api:{customer}": 4, "*": 9}
    limited_tasks = [(n, s) for n, s in check_app(app) if n.startswith("p.")]
    with caplog.at_level(logging.WARNING, logger="celery_semaphore"):
        assert warn_unmatched_keys(app, limited_tasks) == []
    assert not [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name == "celery_semaphore.config"
    ]


def test_a_name_from_a_callable_may_be_anything(app: Celery) -> None:
    tasks(app)

    @app.task(name="p.any", shared=False)
    @limited(lambda args: f"x-{args['n']}", limit=2)
    def anything(n: int) -> None: ...

    app.conf.semaphore_limits = {"db-mian": 2}
    limited_tasks = [(n, s) for n, s in check_app(app) if n.startswith("p.")]
    assert unmatched_keys(app, limited_tasks) == []  # conservative: nothing is sure
