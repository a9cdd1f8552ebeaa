"""The chaos harness can fail: its counter and ledger see what they must (no workers)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .harness import overlap
from .record import Entry, Recorder

pytestmark = pytest.mark.chaos


def test_counter_sees_over_limit_and_double_bodies() -> None:
    rec = Recorder(Path(tempfile.mkdtemp()), limit=1)
    assert rec.enter("t1:0:1") == 1
    assert rec.enter("t2:0:2") == 2  # the same pid is alive (ours), so both count
    assert rec.enter("t1:0:3") == 3  # t1 again while t1 is inside
    counts = rec.read()
    assert (counts.max, counts.over, counts.double) == (3, 2, 1)


def test_a_killed_body_stops_counting_and_its_start_is_on_record() -> None:
    directory = Path(tempfile.mkdtemp())
    code = (
        "import os, signal, sys; from tests.chaos.record import Recorder; "
        f"r = Recorder({str(directory)!r}, 1); "
        "cm = r.body('dead', 0, 'x'); cm.__enter__(); os.kill(os.getpid(), signal.SIGKILL)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=os.getcwd(), check=False)
    assert proc.returncode == -9
    rec = Recorder(directory, limit=1)
    assert rec.read().inside == 0  # its process is dead: it no longer counts
    assert rec.enter("alive:0:1") == 1
    assert rec.read().over == 0
    assert [(e.event, e.task_id) for e in rec.ledger()] == [("start", "dead")]


def test_overlap_counts_only_the_time_over_the_limit_and_sets_the_stale_bodies_apart() -> None:
    def entry(event: str, task: str, at: float) -> Entry:
        return Entry(event, task, 0, 1, at)

    ledger = [  # limit 2: two stale bodies 0-10, two fresh ones from 3 (the window 3-10)
        entry("start", "s1", 0.0),
        entry("start", "s2", 0.0),
        entry("start", "f1", 3.0),
        entry("start", "f2", 4.0),
        entry("end", "s1", 9.0),
        entry("end", "s2", 10.0),
        entry("end", "f1", 12.0),
        entry("end", "f2", 12.0),
    ]
    window, first, last, worst = overlap(ledger, 2, {"s1", "s2"})
    assert (window, first, last, worst) == (7.0, 3.0, 10.0, 2)
    # a third fresh body beside them is over the limit even without the stale ones
    ledger.append(entry("start", "f3", 11.0))
    ledger.append(entry("end", "f3", 11.5))
    assert overlap(ledger, 2, {"s1", "s2"})[3] == 3
