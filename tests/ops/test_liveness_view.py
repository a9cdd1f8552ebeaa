"""Operators see each holder's process liveness: ``celery semaphore show`` (text and
``--json``) and the web page's API say whether its process's liveness record is live, expired
(reclaimed at the next call) or absent (lease only), with the process's ident escaped."""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_semaphore.core import liveness
from tests.conftest import SemaphoreFactory

from .conftest import Cli
from .test_cli import owner
from .test_hostile_names import assert_safe, served  # noqa: F401
from .test_web_app import request

NAME = "live-view"
#: an ident another process wrote (no whitespace: the wire splits on it), with a clear-screen
#: sequence and a bidi override
GHOST = "evil\x1b[2J/7/\u202eabc"
GHOST_SHOWN = r"evil\x1b[2J/7/\u202eabc"


@pytest.fixture
def holders(make_semaphore: SemaphoreFactory, redis_client: redis.Redis) -> Iterator[Any]:
    """Three holders of ``NAME``: task t-alive (this process, its record live), t-dead (a
    process whose record expired 1.5 s ago), t-plain (granted without liveness)."""
    liveness.stop()  # no refresh of an earlier test's records sweeps the expired one
    sem = make_semaphore(NAME, 3, liveness_ttl=30.0)
    try:
        assert sem.acquire(owner=owner("t-alive")) is not None
        assert make_semaphore(NAME, 3).acquire(owner=owner("t-plain")) is not None
        sem._live_arg = f"60000 {GHOST}"
        assert sem.acquire(owner=owner("t-dead")) is not None
        seconds, micros = redis_client.time()
        expired = int(seconds) * 1000 + int(micros) // 1000 - 1500
        redis_client.zadd(liveness.procs_key(sem.key_prefix), {GHOST: expired}, xx=True)
        yield sem
    finally:
        liveness.stop()


def _by_task(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["task_id"]: row for row in rows}


def test_show_gives_each_holder_liveness_with_the_ident_escaped(cli: Cli, holders: Any) -> None:
    shown = cli("show", NAME)
    assert shown.exit_code == 0, shown.output
    assert_safe(shown.stdout)
    lines = shown.stdout.splitlines()
    assert next(line for line in lines if "TOKEN" in line).split()[-2:] == ["PROCESS", "LIVENESS"]
    tasks = ("t-alive", "t-dead", "t-plain")
    row = {task: next(line for line in lines if f" {task} " in line) for task in tasks}
    assert liveness.ident() in row["t-alive"]
    assert re.search(r"alive \(record expires in (2\d|30)\.\ds\)$", row["t-alive"])
    assert GHOST_SHOWN in row["t-dead"]
    assert re.search(
        r"process record expired \d\.\ds ago: reclaimed at the next call$", row["t-dead"]
    )
    assert row["t-plain"].split()[-2:] == ["-", "-"]  # no process, lease only

    data = _by_task(json.loads(cli("show", NAME, "--json").stdout)["holder_list"])
    assert (data["t-alive"]["process"], data["t-alive"]["liveness"]) == (liveness.ident(), "alive")
    assert 25.0 < data["t-alive"]["liveness_left"] <= 30.0
    assert (data["t-dead"]["process"], data["t-dead"]["liveness"]) == (GHOST, "expired")
    assert -3.0 < data["t-dead"]["liveness_left"] < -1.4
    plain = data["t-plain"]
    assert (plain["process"], plain["liveness"], plain["liveness_left"]) == (None, None, None)


def test_the_web_api_gives_each_holder_liveness(served: str, holders: Any) -> None:  # noqa: F811
    status, _, body = request(served + "/api/semaphore?name=" + urllib.parse.quote(NAME))
    assert status == 200, body
    assert all(0x20 <= b < 0x7F for b in body), body  # the ident's controls are JSON escapes
    data = _by_task(json.loads(body)["holder_list"])
    assert [data[t]["liveness"] for t in ("t-alive", "t-dead", "t-plain")] == [
        "alive",
        "expired",
        None,
    ]
    assert data["t-dead"]["process"] == GHOST
    script = request(served + "/static/app.js")[2].decode()
    assert '"Process", "Liveness"' in script
    assert "process record expired " in script  # the page words it as `show` does


def test_show_says_a_dead_process_holders_come_back(
    cli: Cli, holders: Any, redis_client: redis.Redis
) -> None:
    """Its record gone (another process's refresh removed it): still dead; and once the next
    acquire reclaimed it, ``show`` counts it apart from the expired leases."""
    redis_client.zrem(liveness.procs_key(holders.key_prefix), GHOST)
    gone = _by_task(json.loads(cli("show", NAME, "--json").stdout)["holder_list"])["t-dead"]
    assert (gone["liveness"], gone["liveness_left"]) == ("gone", None)
    text = cli("show", NAME).stdout
    assert "process record gone: reclaimed at the next call" in text
    holders._live_arg = f"30000 {liveness.ident()}"
    assert holders.acquire(owner=owner("t-next")) is not None
    after = cli("show", NAME)
    assert "t-dead" not in after.stdout
    assert "0 lease(s) expired and taken back, 1 permit(s) of dead processes" in after.stdout
    assert json.loads(cli("show", NAME, "--json").stdout)["died_total"] == 1


def test_explain_gives_a_holder_liveness(cli: Cli, holders: Any) -> None:
    """``explain`` of a holding task says whether its process is alive; its table of holders
    (for a waiting task) has the same column as ``show``."""
    alive = cli("explain", "t-alive", "--name", NAME)
    assert alive.exit_code == 0, alive.output
    assert re.search(r"liveness: alive \(record expires in (2\d|30)\.\ds\)\.", alive.stdout)
    dead = cli("explain", "t-dead", "--name", NAME).stdout
    assert_safe(dead)
    assert re.search(r"liveness: process record expired \d\.\ds ago: reclaimed at the next", dead)
    assert "liveness: -." in cli("explain", "t-plain", "--name", NAME).stdout
