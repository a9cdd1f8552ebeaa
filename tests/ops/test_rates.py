"""Rate windows in the operator tools: ``list``, ``show``, ``explain``, ``top`` (text and
``--json``) and the metrics show each window of a semaphore's ``rate=``, and a waiter that the
rate holds back (not the units) is said to be held by the rate, with when its window opens.

Against the real Redis and the real core.  Most tests use minute windows (``"2/m"``): the
window stays full for the whole test however slow the machine is; one test uses ``"2/s"`` and
checks that the window's opening is shown too.  The last tests build snapshots by hand for the
cases the core makes hard to pin (a heavy head, several windows, a capped partition).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from celery import Celery
from prometheus_client import CollectorRegistry

from celery_semaphore.core.rates import Rate
from celery_semaphore.core.semaphore import (
    PartitionInfo,
    RateWindowInfo,
    Snapshot,
    WaiterInfo,
)
from celery_semaphore.ops import cli_render, metrics, views
from celery_semaphore.ops.registry import Known
from tests.conftest import SemaphoreFactory

from .conftest import Cli
from .test_cli import closed_port


def owner(task_id: str) -> dict[str, Any]:
    return {"task_id": task_id, "task": "ops.one", "host": "w1@test", "pid": 4242}


def saturate_alpha(make_semaphore: SemaphoreFactory, rate: str = "2/m") -> Any:
    """alpha (limit 3) with ``rate``: t1 and t2 started (the window is full), t1 released (2
    units free); t3 waits at the head in a slot, t4 behind it, parked."""
    sem = make_semaphore("alpha", 3, rate=rate)
    p1 = sem.acquire(owner=owner("t1"), blocking=False)
    p2 = sem.acquire(owner=owner("t2"), blocking=False)
    assert p1 is not None
    assert p2 is not None
    assert p1.release()
    head = sem.try_acquire("t3:0", owner=owner("t3"), place_ttl=60)
    behind = sem.try_acquire("t4:0", owner=owner("t4"), place_ttl=60, wake_data="{}")
    # the core agrees the rate is in the way (this is what the views must find too)
    assert (head.position, behind.position) == (0, 1)
    assert head.rate_retry_after is not None
    assert head.rate_retry_after > 0
    return sem, p2


def _check_full_window(win: dict[str, Any], rate: str, count: int, period: float) -> None:
    assert (win["rate"], win["count"], win["period"]) == (rate, count, period)
    assert (win["started"], win["available"]) == (count, 0)
    assert 0 < win["opens_in"] <= period


def test_list_and_show_give_each_window_its_starts_and_room(
    cli: Cli, make_semaphore: SemaphoreFactory
) -> None:
    saturate_alpha(make_semaphore)
    beta = make_semaphore("beta", 4)  # no rate
    assert beta.acquire(owner=owner("b1"), blocking=False) is not None

    listed = {row["name"]: row for row in json.loads(cli("list", "--json").stdout)}
    [window] = listed["alpha"]["rates"]
    _check_full_window(window, "2/m", 2, 60.0)
    assert listed["beta"]["rates"] == []
    text = cli("list").stdout
    rate_lines = [line for line in text.splitlines() if "rate " in line]
    assert len(rate_lines) == 1, text
    assert rate_lines[0].startswith("  alpha / rate 2/m: 2 started, 0 available, opens in ")

    data = json.loads(cli("show", "alpha", "--json").stdout)
    [window] = data["rates"]
    _check_full_window(window, "2/m", 2, 60.0)
    text = cli("show", "alpha").stdout
    assert "\n  rate 2/m: 2 started, 0 available, opens in " in text
    beta_text = cli("show", "beta").stdout
    assert "rate" not in beta_text
    assert json.loads(cli("show", "beta", "--json").stdout)["rates"] == []

    frame = cli("top", "--iterations", "1").stdout
    [bar_line] = [line for line in frame.splitlines() if "rate 2/m" in line]
    assert "[" + "#" * 30 + "]" in bar_line
    assert "2 started, 0 available, opens in " in bar_line


def test_show_says_which_waiter_the_rate_holds_and_keeps_how_it_waits(
    cli: Cli, make_semaphore: SemaphoreFactory
) -> None:
    saturate_alpha(make_semaphore)
    data = json.loads(cli("show", "alpha", "--json").stdout)
    waiters = {w["task_id"]: w for w in data["waiter_list"]}
    head, behind = waiters["t3"], waiters["t4"]
    # HOW it waits is unchanged; WHY is the rate for the head only
    assert (head["how"], behind["how"]) == ("waiting in a slot", "parked in the broker")
    assert behind["why"] is None
    why = head["why"]
    assert (why["kind"], why["rate"], why["at_least"]) == ("rate", "2/m", False)
    assert 0 < why["ends_in"] <= 60
    assert why["text"] == f"held by the rate 2/m: the window opens in {why['ends_in']:.1f}s"
    [full] = why["windows"]
    _check_full_window(full, "2/m", 2, 60.0)

    text = cli("show", "alpha").stdout
    rows = text.split("WAITERS (2)")[1].strip().splitlines()
    assert rows[0].split()[-4:] == ["HOW", "WHY", "IT", "WAITS"]
    head_row, behind_row = rows[1], rows[2]
    assert head_row.split()[:2] == ["0", "t3"]
    assert "waiting in a slot" in head_row
    assert "held by the rate 2/m: the window opens in " in head_row
    assert behind_row.split()[:2] == ["1", "t4"]
    # WHY IT WAITS: the rate for both (behind the head, it needs the room for two starts)
    assert "parked in the broker  rate 2/m full: opens in " in behind_row
    assert (head["reason"]["kind"], behind["reason"]["kind"]) == ("rate", "rate")
    assert head["reason"]["text"] == why["text"]
    assert behind["reason"]["because"].startswith(
        "its rate window is full: the rate 2/m has room for 0 more start(s) now and it needs 2 "
        "(its own and those ahead of it); the window opens in "
    )
    assert data["waiting_by_reason"]["rate"] == 2


def test_explain_gives_the_rate_as_the_reason_and_when_it_ends(
    cli: Cli, make_semaphore: SemaphoreFactory
) -> None:
    saturate_alpha(make_semaphore)
    [why] = json.loads(cli("explain", "t3", "--json").stdout)
    assert (why["free"], why["needed"]) == (2, 0)  # the units are not what it waits for
    assert why["why"]["kind"] == "rate"
    assert why["head_why"] is None  # it is the head
    assert 0 < why["estimate"] <= 60
    assert why["estimate_basis"] == "its units are free: it starts when the rate 2/m has room"
    text = cli("explain", "t3").stdout
    assert "  rate 2/m: 2 started, 0 available, opens in " in text
    assert "  held by the rate 2/m: the window opens in " in text
    assert "(its units are free: it starts then)" in text
    assert "estimate: about " in text
    assert "estimate: now" not in text
    assert "waiting in a slot of its worker's pool" in text  # how, kept

    [why] = json.loads(cli("explain", "t4", "--json").stdout)
    assert why["why"] is None  # not the head: it waits for its turn
    assert why["head_why"]["rate"] == "2/m"
    # the head and itself need 2 starts; the window is full: one opens, the next a pace later
    assert why["estimate"] > 0
    assert "the rate 2/m allows 2 start(s) per 1m00s" in why["estimate_basis"]
    text = cli("explain", "t4").stdout
    assert "  the head of its line is held by the rate 2/m: the window opens in " in text
    assert "  held by the rate" not in text
    assert "parked in the broker" in text


def test_a_waiter_the_units_hold_is_not_held_by_the_rate(
    cli: Cli, make_semaphore: SemaphoreFactory
) -> None:
    # room in the window, no free unit: the units hold it
    beta = make_semaphore("beta", 4, rate="10/m")
    assert beta.acquire(owner=owner("b1"), weight=4, blocking=False) is not None
    beta.try_acquire("b2:0", owner=owner("b2"), place_ttl=60)
    data = json.loads(cli("show", "beta", "--json").stdout)
    assert [(w["task_id"], w["why"]) for w in data["waiter_list"]] == [("b2", None)]
    [window] = data["rates"]
    assert (window["started"], window["available"], window["opens_in"]) == (4, 6, 0.0)
    text = cli("show", "beta").stdout
    assert "\n  rate 10/m: 4 started, 6 available\n" in text  # no "opens in": it has room
    assert "semaphore full: 4 of 4 unit(s) in use, 0 free" in text
    assert "held by the rate" not in text
    assert data["waiter_list"][0]["reason"]["kind"] == "units"
    explained = cli("explain", "b2").stdout
    assert "held by the rate" not in explained
    assert "units to come free before its turn: 1" in explained

    # a full window AND too few free units: the units come first, so not the rate
    alpha = make_semaphore("alpha", 3, rate="2/m")
    assert alpha.acquire(owner=owner("a1"), weight=2, blocking=False) is not None
    attempt = alpha.try_acquire("a2:0", owner=owner("a2"), place_ttl=60, weight=2)
    assert attempt.position == 0
    data = json.loads(cli("show", "alpha", "--json").stdout)
    [window] = data["rates"]
    assert (window["available"], data["available"]) == (0, 1)
    assert [(w["task_id"], w["why"]) for w in data["waiter_list"]] == [("a2", None)]
    assert "held by the rate" not in cli("explain", "a2").stdout


def test_no_rate_no_rate_output(cli: Cli, make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("alpha", 3)
    assert sem.acquire(owner=owner("t1"), weight=3, blocking=False) is not None
    sem.try_acquire("t2:0", owner=owner("t2"), place_ttl=60)
    outputs = [cli(*args) for args in (["list"], ["show", "alpha"], ["explain", "t2"])]
    for result in outputs:
        assert result.exit_code == 0, result.output
        # no rate window line ("rate 2/m: ..."); other apps' task names may say "rate"
        assert re.search(r"\brate \d+/\d*[smhd]", result.stdout) is None, result.stdout
        assert "held by the rate" not in result.stdout, result.stdout
    assert json.loads(cli("show", "alpha", "--json").stdout)["rates"] == []
    [why] = json.loads(cli("explain", "t2", "--json").stdout)
    assert (why["why"], why["head_why"], why["rates"]) == (None, None, [])


def test_the_collector_exports_each_rate_window(
    app: Celery, make_semaphore: SemaphoreFactory
) -> None:
    saturate_alpha(make_semaphore)
    make_semaphore("beta", 4).acquire(owner=owner("b1"), blocking=False)  # no rate
    registry = CollectorRegistry()
    registry.register(metrics.SemaphoreCollector(app))

    def value(name: str, semaphore: str = "alpha", window: str = "2/m") -> float | None:
        return registry.get_sample_value(name, {"semaphore": semaphore, "window": window})

    assert value("celery_semaphore_rate_limit") == 2
    assert value("celery_semaphore_rate_period_seconds") == 60
    assert value("celery_semaphore_rate_started") == 2
    assert value("celery_semaphore_rate_available") == 0
    opens = value("celery_semaphore_rate_opens_in_seconds")
    assert opens is not None
    assert 0 < opens <= 60
    # only alpha's one window: nothing for beta (no rate), nor another window
    for family in registry.collect():
        if family.name.startswith("celery_semaphore_rate_"):
            assert [s.labels for s in family.samples] == [
                {"semaphore": "alpha", "window": "2/m"}
            ], family.name


def test_a_one_second_window_is_shown_full_then_open(
    cli: Cli, make_semaphore: SemaphoreFactory
) -> None:
    """``rate="2/s"``: right after two starts the window is full and opens within a second;
    once it has opened, it has room and the head is no longer held by the rate."""
    sem = make_semaphore("alpha", 3, rate="2/s")
    fast = None
    for _ in range(3):  # a stalled machine can miss the window: start again, a few times
        began = time.monotonic()
        first = sem.acquire(owner=owner("t1"), blocking=False)
        second = sem.acquire(owner=owner("t2"), blocking=False)
        assert first is not None
        assert second is not None
        sem.try_acquire("t3:0", owner=owner("t3"), place_ttl=60)
        data = json.loads(cli("show", "alpha", "--json").stdout)
        if time.monotonic() - began < 0.8:  # read well within the window's second
            fast = data
            break
        sem.withdraw("t3:0")
        first.release()
        second.release()
        time.sleep(1.0)  # let the window empty before trying again
    assert fast is not None, "three tries, each took 0.8 s or more to read the window"
    [window] = fast["rates"]
    _check_full_window(window, "2/s", 2, 1.0)
    [head] = fast["waiter_list"]
    assert head["why"]["rate"] == "2/s"
    assert 0 < head["why"]["ends_in"] <= 1.0

    deadline = time.monotonic() + 5
    opened = None
    while time.monotonic() < deadline:  # polls the operator's view: nothing to wait on
        data = json.loads(cli("show", "alpha", "--json").stdout)
        if data["rates"][0]["available"] > 0:
            opened = data
            break
        time.sleep(0.1)
    assert opened is not None, "the 2/s window did not open within 5 s"
    assert opened["rates"][0]["opens_in"] == 0.0
    # the head may have been granted meanwhile (a blocking waiter would be); if it still
    # waits, the rate no longer holds it
    assert all(w["why"] is None for w in opened["waiter_list"])


def test_the_web_pages_json_has_the_windows_and_the_reason(
    app: Celery, make_semaphore: SemaphoreFactory
) -> None:
    """The page draws what its JSON says (the browser test, test_web.py, checks the drawing)."""
    from celery_semaphore.ops import web

    from .test_web_app import request

    saturate_alpha(make_semaphore)
    port = closed_port()
    server, _ = web.start_server(app, port=port, token="tok")
    try:
        url = f"http://127.0.0.1:{port}"
        rows = json.loads(request(url + "/api/semaphores")[2])["semaphores"]
        [window] = next(r for r in rows if r["name"] == "alpha")["rates"]
        _check_full_window(window, "2/m", 2, 60.0)
        detail = json.loads(request(url + "/api/semaphore?name=alpha")[2])
        whys = {w["task_id"]: w["why"] for w in detail["waiter_list"]}
        assert whys["t4"] is None
        assert whys["t3"]["text"].startswith("held by the rate 2/m: the window opens in ")
        [result] = json.loads(request(url + "/api/explain?task_id=t3")[2])["results"]
        assert "  held by the rate 2/m: the window opens in " in result["text"]
    finally:
        server.shutdown()
        server.server_close()
    script = (Path(web.__file__).parent / "web_static" / "app.js").read_text(encoding="utf-8")
    # the script draws the windows and the reason from these fields, as text
    for needle in ("s.rates", "d.rates", "w.why.text", 'class: "rate"', '"why"'):
        assert needle in script, needle


# -- cases built by hand ------------------------------------------------------------------------

NOW = 1_000_000.0
ENTRY = Known("gpu", {"proj.render": (4, 1)})


def _waiter(task_id: str, position: int, weight: int = 1, partition: str = "") -> WaiterInfo:
    return WaiterInfo(
        f"{task_id}:0", position, weight, NOW - 3, 30.0, False, {"task_id": task_id}, partition
    )


def _snapshot(rates: list[RateWindowInfo], waiters: list[WaiterInfo], **extra: Any) -> Snapshot:
    return Snapshot(
        name="gpu",
        limit=4,
        limit_override=None,
        used=1,
        server_time=NOW,
        waiters=waiters,
        rates=rates,
        **extra,
    )


def test_a_heavy_head_is_held_until_the_room_for_its_weight() -> None:
    # weight 3, one start of room: the window "has room" for one more start now, not for it
    snap = _snapshot([RateWindowInfo(Rate(5, 1.0), 4, 0.0)], [_waiter("w", 0, weight=3)])
    why = views.held_by_rate(snap, snap.waiters[0])
    assert why is not None
    assert (why["at_least"], why["ends_in"], why["ends_within"]) == (True, 0.0, 1.0)
    assert why["text"] == (
        "held by the rate 5/s: its weight 3 needs more room than the 1 left; enough opens "
        "within 1.0s"
    )
    detail = views.detail(ENTRY, snap)
    assert detail["waiter_list"][0]["why"] == why
    explained = views.explain(ENTRY, snap, "w")
    assert explained is not None
    # 2 starts beyond the room, at the window's pace (5 per second): about 0.4 s, not "now"
    assert explained["estimate"] == 0.4
    assert explained["estimate_basis"].endswith("for its weight 3, roughly at the window's pace")
    text = cli_render.explanation(explained)
    assert "(its units are free: it starts when the window has room for its weight 3)" in text
    assert "estimate: about 0.4s" in text


def test_every_full_window_is_named_and_the_last_to_open_counts() -> None:
    rates = [
        RateWindowInfo(Rate(2, 1.0), 2, 0.4),
        RateWindowInfo(Rate(5, 10.0), 4, 0.0),  # room for exactly its weight: not named
        RateWindowInfo(Rate(10, 60.0), 10, 12.5),
        RateWindowInfo(Rate(1000, 3600.0), 12, 0.0),  # has room: not named
    ]
    snap = _snapshot(rates, [_waiter("w", 0)])
    why = views.held_by_rate(snap, snap.waiters[0])
    assert why is not None
    assert (why["rate"], why["ends_in"]) == ("2/s, 10/m", 12.5)
    assert why["text"] == "held by the rate 2/s, 10/m: the windows open in 12.5s"
    lines = cli_render.limit_lines({"rates": views.rate_windows(snap)})
    assert lines == [
        "rate 2/s: 2 started, 0 available, opens in 0.4s",
        "rate 5/10s: 4 started, 1 available",
        "rate 10/m: 10 started, 0 available, opens in 12.5s",
        "rate 1000/h: 12 started, 988 available",
    ]


def test_a_head_its_partition_cap_holds_is_not_held_by_the_rate() -> None:
    full = [RateWindowInfo(Rate(2, 1.0), 2, 0.4)]
    parts = [PartitionInfo("video", 1, 1, 1, 1), PartitionInfo("audio", 0, 1, None, 1)]
    waiters = [_waiter("v", 0, partition="video"), _waiter("a", 0, partition="audio")]
    snap = _snapshot(full, waiters, partitions=parts)
    assert views.held_by_rate(snap, waiters[0]) is None  # its cap (1) is used up
    assert views.held_by_rate(snap, waiters[1]) is not None  # no cap: free units fit
    assert views.held_by_rate(snap, _waiter("x", 1, partition="audio")) is None  # not a head
