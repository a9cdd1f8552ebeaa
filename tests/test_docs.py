"""The docs cannot drift from the code: every setting and option is documented."""

from __future__ import annotations

import re
from pathlib import Path

from celery_semaphore import config

ROOT = Path(__file__).resolve().parents[1]


def test_every_setting_is_in_the_settings_reference() -> None:
    text = (ROOT / "docs" / "settings.md").read_text()
    # LimitedTask's class attributes share the prefix but are not app settings
    class_attrs = {"semaphore_name", "semaphore_limit", "semaphore_weight"}
    documented = set(re.findall(r"`(semaphore_[a-z_]+)`", text)) - class_attrs
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
