"""The gate's INFO line per held wait is rate-limited per semaphore (issue 18): a flood of
arrivals logs one INFO line per semaphore per ``WAIT_INFO_EVERY`` seconds, the next one
saying how many waited meanwhile; every wait is still logged at DEBUG."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from celery_semaphore.core import clock as core_clock
from celery_semaphore.integration.gate import waitlog as waitlog_module
from celery_semaphore.integration.gate.waitlog import WAIT_INFO_EVERY, WaitLog
from tests.log_records import LogRecords


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def records() -> Iterator[LogRecords]:
    handler = LogRecords()
    logger = logging.getLogger("celery_semaphore.wait")
    before = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)


def _entry(name: str, n: int) -> Any:
    """What WaitLog.log reads of a held task's entry."""
    return SimpleNamespace(
        req=SimpleNamespace(name="proj.charge", id=f"t{n}"),
        sem=SimpleNamespace(name=name, limit=3),
        position=n,
        counted=True,
        ready=True,
        retry_at=0.0,
        ticket=f"t{n}:0",
    )


def _lines(records: LogRecords, level: int) -> list[str]:
    return [r.getMessage() for r in records.records if r.levelno == level]


def test_one_info_line_per_semaphore_per_period_with_the_count(
    records: LogRecords, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock()
    monkeypatch.setattr(core_clock, "monotonic", clock)
    waits = WaitLog()  # needs no consumer or Redis
    for n in range(5):  # a flood on "a", and one wait on "b"
        waits.log(_entry("a", n))
    waits.log(_entry("b", 0))
    info = _lines(records, logging.INFO)
    assert len(info) == 2, info
    assert "[semaphore=a task=t0] task proj.charge waits (limit 3, position 0)" in info[0]
    assert "[semaphore=b task=t0]" in info[1]
    assert not any("meanwhile" in line for line in info)
    assert len(_lines(records, logging.DEBUG)) == 4  # t1..t4 on "a"

    clock.now += WAIT_INFO_EVERY - 0.1  # still within the period: DEBUG only
    waits.log(_entry("a", 5))
    assert len(_lines(records, logging.INFO)) == 2
    clock.now += 0.1  # the period is over: INFO again, with the count of the quiet ones
    waits.log(_entry("a", 6))
    info = _lines(records, logging.INFO)
    assert len(info) == 3, info
    assert "task=t6" in info[2]
    assert info[2].endswith("; 5 more task(s) waited meanwhile (logged at DEBUG)"), info[2]
    assert len(_lines(records, logging.DEBUG)) == 5

    clock.now += WAIT_INFO_EVERY  # nobody waited quietly since: no count
    waits.log(_entry("a", 7))
    assert "meanwhile" not in _lines(records, logging.INFO)[3]


def test_the_table_of_semaphores_is_bounded(
    records: LogRecords, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waitlog_module, "WAIT_INFO_NAMES", 3)
    waits = WaitLog()
    for n in range(10):
        waits.log(_entry(f"api:{n}", 0))
    assert list(waits._wait_info) == ["api:7", "api:8", "api:9"]
    assert len(_lines(records, logging.INFO)) == 10  # every name's first wait at INFO


def test_the_line_says_what_the_wait_ends_with(
    records: LogRecords, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock()
    monkeypatch.setattr(core_clock, "monotonic", clock)
    waits = WaitLog()
    by_rate = _entry("rated", 0)
    by_rate.retry_at = clock.now + 0.4
    for entry in (_entry("plain", 2), by_rate):
        waits.log(entry)
    info = _lines(records, logging.INFO)
    assert info[0].endswith("until a release wakes it"), info
    assert info[1].endswith("until its rate window lets it start (in 0.4s)"), info
