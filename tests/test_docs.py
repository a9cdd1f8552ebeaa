"""The settings and options references cannot drift from the code: every setting and option
is documented with its default, and the examples are what a worker accepts."""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery import _state as celery_state

from celery_semaphore.integration import config, renames

from .doc_blocks import blocks

ROOT = Path(__file__).resolve().parents[1]


def test_every_setting_is_in_the_settings_reference() -> None:
    text = (ROOT / "docs" / "settings.md").read_text()
    # LimitedTask's class attributes share the prefix but are not app settings
    class_attrs = {"semaphore_name", "semaphore_limit", "semaphore_weight"}
    # the former names of renamed settings are in its "Renamed settings" table
    documented = set(re.findall(r"`(semaphore_[a-z_]+)`", text)) - class_attrs
    documented -= set(renames.RENAMED_SETTINGS)
    in_code = set(config.APP_SETTINGS) | {o.setting for o in config.OPTIONS.values()}
    assert in_code - documented == set(), "settings missing from docs/settings.md"
    assert documented - in_code == set(), "docs/settings.md names settings the code lacks"


def test_every_setting_is_in_the_changelog() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    in_code = set(config.APP_SETTINGS) | {o.setting for o in config.OPTIONS.values()}
    assert {s for s in in_code if s not in text} == set()


def test_defaults_in_docs_match_the_code() -> None:
    text = (ROOT / "docs" / "settings.md").read_text()
    for opt in config.OPTIONS.values():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{opt.setting}`"))
        shown = repr(opt.default) if not isinstance(opt.default, str) else f'"{opt.default}"'
        assert f"`{shown}`" in row, f"{opt.setting}: default {shown} not in {row!r}"


def test_app_setting_defaults_in_docs_match_the_code() -> None:
    text = (ROOT / "docs" / "settings.md").read_text()
    for setting, (default, _check) in config.APP_SETTINGS.items():
        if setting == "semaphore_redis_url":
            continue  # its default is a rule (result backend, else broker), given in words
        row = next(line for line in text.splitlines() if line.startswith(f"| `{setting}`"))
        shown = repr(default) if not isinstance(default, str) else f'"{default}"'
        assert f"`{shown}`" in row, f"{setting}: default {shown} not in {row!r}"


def _block_with(page: str, needle: str) -> str:
    found = [b.source for b in blocks(ROOT / "docs" / page) if needle in b.source]
    assert len(found) == 1, f"expected one block with {needle!r} on docs/{page}"
    return found[0]


def _exec_app_block(source: str) -> Any:
    """Run a block that makes a Celery app, without making it the current app."""
    previous = celery_state.get_current_app()
    namespace: dict[str, Any] = {"__name__": "proj"}
    try:
        exec(compile(source, "<doc block>", "exec"), namespace)
    finally:
        celery_state._set_current_app(previous)
    return namespace["app"]


def test_settings_example_sets_every_setting_and_a_worker_accepts_it() -> None:
    app = _exec_app_block(_block_with("settings.md", "app.conf.update("))
    known = set(config.APP_SETTINGS) | {o.setting for o in config.OPTIONS.values()}
    given = {key for key in app.conf.changes if key.startswith("semaphore_")}
    assert given == known, "the example must set every setting, and only real ones"
    # exactly what a worker checks at start
    checked = config.validate_app_settings(app.conf, getattr(app, "namespace", None))
    assert set(checked) == known
    defaults = {key: default for key, (default, _) in config.APP_SETTINGS.items()}
    defaults.update({o.setting: o.default for o in config.OPTIONS.values()})
    same = {key for key in known if checked[key] == defaults[key]}
    # an example that shows the default teaches nothing (the two booleans are True by default;
    # semaphore_redis_cluster=True would need cluster nodes, the example's URL is one server)
    assert same <= {"semaphore_enabled", "semaphore_retry_jitter", "semaphore_redis_cluster"}


def test_django_settings_block_is_accepted_under_the_celery_namespace() -> None:
    source = _block_with("recipes.md", "CELERY_SEMAPHORE_LIMITS")
    settings: dict[str, Any] = {}
    exec(compile(source, "<doc block>", "exec"), settings)
    module = types.SimpleNamespace(**{k: v for k, v in settings.items() if k.isupper()})
    app = Celery("proj", set_as_current=False)
    app.config_from_object(module, namespace="CELERY")
    checked = config.validate_app_settings(app.conf, "CELERY")
    names = [k for k in vars(module) if k.startswith("CELERY_SEMAPHORE_")]
    assert len(names) >= 2
    for name in names:
        setting = name[len("CELERY_") :].lower()
        assert checked[setting] == getattr(module, name), name
    # and a misspelt one is what stops the worker
    module.CELERY_SEMAPHORE_LEASE_TTLL = 3
    typo = Celery("proj", set_as_current=False)
    typo.config_from_object(module, namespace="CELERY")
    with pytest.raises(ValueError, match=r"unknown setting.*CELERY_SEMAPHORE_LEASE_TTLL"):
        config.validate_app_settings(typo.conf, "CELERY")


def test_options_reference_matches_the_code() -> None:
    text = (ROOT / "docs" / "options.md").read_text()
    rows = {
        m.group(1): line
        for line in text.splitlines()
        if (m := re.match(r"\| `([a-z_]+)` \| `semaphore_", line))
    }
    assert set(rows) == set(config.OPTIONS) | set(config.SPEC_OPTIONS), "docs/options.md's table"
    for opt in [*config.OPTIONS.values(), config.Option("weight", 1, lambda p, v: v)]:
        row = rows[opt.name]
        assert f"| `{opt.setting}` |" in row, f"{opt.name}: LimitedTask attribute"
        shown = repr(opt.default) if not isinstance(opt.default, str) else f'"{opt.default}"'
        assert f"`{shown}`" in row, f"{opt.name}: default {shown} not in {row!r}"
    attrs = set(re.findall(r"`(semaphore_[a-z_]+)`", text)) - {"semaphore_name", "semaphore_limit"}
    assert attrs <= {f"semaphore_{name}" for name in [*config.OPTIONS, *config.SPEC_OPTIONS]} | {
        "semaphore_limits",
        "semaphore_worker_hold",
        "semaphore_worker_standby",
        *renames.RENAMED_SETTINGS,  # the former attribute names, in the renamed options table
    }


@pytest.mark.parametrize(
    "needle", ["semaphore_redis_cluster=True", '"master_name": "mymaster"', "rediss://celery-app"]
)
def test_deployment_recipes_are_settings_a_worker_accepts(
    needle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Redis Cluster, Sentinel and TLS recipes: exactly what a worker checks at start
    (their certificate files are the reader's, so only the TLS files' existence is assumed)."""
    app = _exec_app_block(_block_with("recipes.md", needle))
    monkeypatch.setattr("os.path.isfile", lambda path: True)
    config.validate_app_settings(app.conf, None)
    settings = config.redis_settings(app.conf)
    assert settings.url == app.conf.semaphore_redis_url


def test_the_acl_recipe_is_the_rule_the_tls_test_runs_a_worker_with() -> None:
    recipe = (ROOT / "docs" / "recipes.md").read_text()
    rule = "resetchannels +@all -@admin -@dangerous"
    assert f"ACL SETUSER celery-app on >app-password ~celery_semaphore:* {rule}" in recipe
    test = (ROOT / "tests" / "deploy" / "test_tls_acl.py").read_text()
    assert '"resetchannels",\n        "+@all",\n        "-@admin",\n        "-@dangerous",' in test
