"""When a task held back by a rate tries again by itself: the places the opening window can
serve first; with a spaced rate, each place one interval after the one before it."""

from __future__ import annotations

import pytest

from celery_semaphore import Semaphore
from celery_semaphore.integration.locks import window_wait

URL = "redis://127.0.0.1:6379/0"  # never connected to: nothing here calls Redis


def test_a_window_serves_count_places_per_period() -> None:
    sem = Semaphore("w", 10, redis=URL, rate="2/s")
    waits = [window_wait(sem, position, 0.25) for position in range(5)]
    assert waits == [0.25, 0.25, 1.25, 1.25, 2.25]


def test_a_spaced_rate_serves_one_place_per_interval() -> None:
    sem = Semaphore("s", 10, redis=URL, rate=["4/s spaced", "100/m"])
    waits = [window_wait(sem, position, 0.1) for position in range(4)]
    assert waits == pytest.approx([0.1, 0.35, 0.6, 0.85])


def test_without_a_rate_only_the_places_the_units_serve_retry() -> None:
    sem = Semaphore("p", 2, redis=URL)
    assert [window_wait(sem, position, 0.5) for position in range(3)] == [0.5, 0.5, None]
