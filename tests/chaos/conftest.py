"""Fixtures of the chaos suite, and the table of measured recovery times printed at the end."""

from __future__ import annotations

from typing import Any

import pytest

from .harness import MEASURED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not MEASURED:
        return
    terminalreporter.section("chaos: measured recovery times")
    for scenario, what, seconds in MEASURED:
        terminalreporter.write_line(f"{scenario:<32} {what:<44} {seconds:8.3f} s")


@pytest.fixture(autouse=True)
def _chaos_marker(request: pytest.FixtureRequest) -> None:
    """Every test here is a chaos test (``-m chaos`` selects them, ``-m 'not chaos'`` skips)."""
    if request.node.get_closest_marker("chaos") is None:
        raise AssertionError(f"{request.node.nodeid}: mark it with pytest.mark.chaos")
