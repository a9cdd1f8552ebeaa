"""The serial phase's lists (tests/phases.py) name tests that exist: a test renamed or moved
would otherwise run in the parallel phase, beside others, without anyone noticing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import phases

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted(phases.SERIAL_FILES | set(phases.SLOW_FIRST)))
def test_listed_files_exist(path: str) -> None:
    assert (ROOT / path).is_file(), f"{path} (tests/phases.py) is not a file"


@pytest.mark.parametrize("node", sorted(phases.SERIAL_TESTS))
def test_listed_tests_exist(node: str) -> None:
    path, name = node.split("::")
    source = (ROOT / path).read_text(encoding="utf-8")
    assert re.search(rf"^(async )?def {re.escape(name)}\(", source, re.M), (
        f"{node} (tests/phases.py) names no test"
    )
