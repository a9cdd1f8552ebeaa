"""Limits that follow the downstream service, in the operator tools: a semaphore whose
adaptive limit was lowered by throttles shows its effective limit and why (``list``, ``show``,
``explain``, ``top``, ``--json``, the metrics and the web page's JSON); a throttle pause is
shown with when it ends, and the head it holds is said to be held by it; the rate check counts
free units from the effective limit; ``set-limit --rate`` stores, shows, clears and audits a
runtime rate (CLI and web page).

Against the real Redis and the real core: the throttles are the core's
(``Permit.throttled``, ``Semaphore.throttled``), read back through ``Semaphore.inspect``.
Pauses are 60 s long, so they last the whole test however slow the machine is.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import Result
from prometheus_client import CollectorRegistry

from celery_semaphore import limited
from celery_semaphore.core.rates import Rate
from celery_semaphore.core.semaphore import RateWindowInfo, Snapshot, WaiterInfo
from celery_semaphore.ops import audit, cli_render, metrics, views
from celery_semaphore.ops.cli import EXIT_USAGE
from celery_semaphore.ops.registry import Known
from tests.conftest import SemaphoreFactory

from .conftest import Cli, make_app, run_cli
from .test_cli import closed_port


@pytest.fixture
def app(redis_url: str, key_prefix: str) -> Iterator[Celery]:
    """geo (code limit 10, adaptive) and calm (code limit 4, never throttled)."""
    app = make_app(redis_url, key_prefix)

    @app.task(name="ad.geo", shared=False)
    @limited("geo", limit=10, adaptive=True)
    def geo() -> None: ...

    @app.task(name="ad.calm", shared=False)
    @limited("calm", limit=4)
    def calm() -> None: ...

    yield app
    app.close()


@pytest.fixture
def cli(app: Celery) -> Cli:
    def run(*args: str, input: str | None = None) -> Result:
        return run_cli(app, *args, input=input)

    return run


def owner(task_id: str) -> dict[str, Any]:
    return {"task_id": task_id, "task": "ad.geo", "host": "w1@test", "pid": 4242}


def lowered_geo(make_semaphore: SemaphoreFactory, **kwargs: Any) -> Any:
    """geo, limit 10, four permits held; one of them throttled: the limit halves to 5."""
    sem = make_semaphore("geo", 10, adaptive=True, **kwargs)
    permits = []
    for i in range(4):
        permit = sem.acquire(owner=owner(f"h{i}"), blocking=False)
        assert permit is not None
        permits.append(permit)
    result = permits[0].throttled()
    assert (result.decreased, result.effective_limit, result.paused_for) == (True, 5, None)
    # the core agrees (this is what the views must show)
    snap = sem.inspect()
    assert (snap.effective_limit, snap.adaptive_limit, snap.throttles_total) == (5, 5, 1)
    return sem, permits


def registry_with(app: Celery) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(metrics.SemaphoreCollector(app))
    return registry


def test_a_lowered_limit_is_shown_with_why_everywhere(
    cli: Cli, app: Celery, make_semaphore: SemaphoreFactory
) -> None:
    lowered_geo(make_semaphore)
    calm = make_semaphore("calm", 4)
    assert calm.acquire(owner=owner("c1"), blocking=False) is not None

    rows = {r["name"]: r for r in json.loads(cli("list", "--json").stdout)}
    eff = rows["geo"]["effective"]
    assert (eff["limit"], eff["of"], eff["lowered"], eff["paused_for"]) == (5, 10, True, None)
    assert (eff["throttles_total"], eff["rises_per"]) == (1, 5)
    assert 0 <= eff["last_throttle_age"] < 30
    assert eff["text"] == (
        "effective limit 5 of 10: lowered after 1 throttle(s), the last "
        f"{views.seconds_text(eff['last_throttle_age'])} ago, rising by 1 per 5 unit(s) of "
        "finished work"
    )
    # free units count from the effective limit: 5 - 4, not 10 - 4
    assert (rows["geo"]["limit"], rows["geo"]["used"], rows["geo"]["available"]) == (10, 4, 1)
    calm_eff = rows["calm"]["effective"]
    assert (calm_eff["limit"], calm_eff["lowered"], calm_eff["text"]) == (4, False, None)
    assert (calm_eff["throttles_total"], calm_eff["last_throttle_age"]) == (0, None)
    assert rows["calm"]["available"] == 3

    text = cli("list").stdout
    [line] = [line for line in text.splitlines() if "effective" in line]
    assert line.startswith("  geo / effective limit 5 of 10: lowered after 1 throttle(s)")

    data = json.loads(cli("show", "geo", "--json").stdout)
    assert data["effective"]["limit"] == 5
    text = cli("show", "geo").stdout
    assert "in use: 4 of 5 (the effective limit; the limit is 10) unit(s) by 4 holder(s)" in text
    assert "; throttled 1 time(s), the last " in text
    assert "\n  effective limit 5 of 10: lowered after 1 throttle(s), the last " in text
    calm_text = cli("show", "calm").stdout
    assert "effective" not in calm_text
    assert "throttled" not in calm_text
    assert "in use: 1 of 4 unit(s)" in calm_text

    frame = cli("top", "--iterations", "1").stdout
    [bar_line] = [line for line in frame.splitlines() if line.startswith("  effective")]
    assert "[" + "#" * 24 + "." * 6 + "]" in bar_line  # 4 of 5
    assert "effective limit 5 of 10: lowered after 1 throttle(s)" in bar_line

    registry = registry_with(app)

    def value(name: str, sem: str) -> float | None:
        return registry.get_sample_value(name, {"semaphore": sem})

    assert value("celery_semaphore_limit", "geo") == 10
    assert value("celery_semaphore_effective_limit", "geo") == 5
    assert value("celery_semaphore_paused_seconds", "geo") == 0
    assert value("celery_semaphore_throttles_total", "geo") == 1
    assert value("celery_semaphore_effective_limit", "calm") == 4
    assert value("celery_semaphore_throttles_total", "calm") == 0


def test_the_effective_limit_rises_back_and_the_views_follow(
    cli: Cli, make_semaphore: SemaphoreFactory
) -> None:
    sem, permits = lowered_geo(make_semaphore)
    for p in permits:  # granted before the decrease: not successes
        assert p.release()
    # 5 units of finished work granted after the decrease: +1
    fresh = [sem.acquire(owner=owner(f"n{i}"), blocking=False) for i in range(5)]
    for p in fresh:
        assert p is not None
        assert p.release()
    eff = json.loads(cli("show", "geo", "--json").stdout)["effective"]
    assert (eff["limit"], eff["lowered"], eff["rises_per"]) == (6, True, 6)
    assert eff["text"].startswith("effective limit 6 of 10: lowered after 1 throttle(s)")


def test_a_pause_is_shown_and_holds_the_head(
    cli: Cli, app: Celery, make_semaphore: SemaphoreFactory
) -> None:
    sem = make_semaphore("calm", 4)  # not adaptive: a throttle only pauses
    assert sem.acquire(owner=owner("c1"), blocking=False) is not None
    result = sem.throttled(retry_after=60)
    assert result.decreased is False
    assert result.paused_for is not None
    head = sem.try_acquire("t9:0", owner=owner("t9"), place_ttl=120)
    behind = sem.try_acquire("t10:0", owner=owner("t10"), place_ttl=120, wake_data="{}")
    assert (head.position, behind.position) == (0, 1)  # the units are free: the pause holds

    data = json.loads(cli("show", "calm", "--json").stdout)
    eff = data["effective"]
    assert (eff["limit"], eff["lowered"], eff["throttles_total"]) == (4, False, 1)
    assert 0 < eff["paused_for"] <= 60
    assert eff["text"].startswith(f"paused {views.seconds_text(eff['paused_for'])} more after ")
    assert eff["text"].endswith(": nobody starts until then")
    whys = {w["task_id"]: w["why"] for w in data["waiter_list"]}
    assert whys["t10"] is None  # not the head: its turn
    why = whys["t9"]
    assert (why["kind"], why["rate"]) == ("pause", None)
    assert 0 < why["ends_in"] <= 60
    ends = views.seconds_text(why["ends_in"])
    assert why["text"] == f"held by a throttle pause: it ends in {ends}"

    text = cli("show", "calm").stdout
    assert "\n  paused " in text
    rows = text.split("WAITERS (2)")[1].strip().splitlines()
    assert rows[0].split()[-3:] == ["WHY", "IT", "WAITS"]
    assert rows[1].split()[:2] == ["0", "t9"]
    assert "held by a throttle pause: it ends in " in rows[1]
    # behind the head, the pause holds it too
    assert "parked in the broker  adaptive pause: nobody starts for " in rows[2]

    [mine] = json.loads(cli("explain", "t9", "--json").stdout)
    assert (mine["free"], mine["needed"], mine["why"]["kind"]) == (3, 0, "pause")
    assert 0 < mine["estimate"] <= 60
    assert mine["estimate_basis"] == "its units are free: it starts when the throttle pause ends"
    text = cli("explain", "t9").stdout
    assert "  held by a throttle pause: it ends in " in text
    assert "(its units are free: it starts then)" in text
    assert "estimate: now" not in text

    [second] = json.loads(cli("explain", "t10", "--json").stdout)
    assert second["why"] is None
    assert second["head_why"]["kind"] == "pause"
    assert second["estimate"] >= mine["estimate"] - 1  # nobody starts before the pause ends
    assert second["estimate_basis"].endswith("nobody starts before the throttle pause ends")
    assert (
        "  the head of its line is held by a throttle pause: it ends in "
        in cli("explain", "t10").stdout
    )

    paused = registry_with(app).get_sample_value(
        "celery_semaphore_paused_seconds", {"semaphore": "calm"}
    )
    assert paused is not None
    assert 0 < paused <= 60


def test_the_rate_check_counts_free_units_from_the_effective_limit(
    cli: Cli, make_semaphore: SemaphoreFactory
) -> None:
    """4 held under a lowered limit of 5 with a full 4/m window: a head of weight 2 fits the
    limit (10) but not the effective limit, so the units hold it, not the rate; a head of
    weight 1 fits and is held by the rate."""
    sem, _ = lowered_geo(make_semaphore, rate="4/m")
    attempt = sem.try_acquire("t9:0", owner=owner("t9"), place_ttl=120, weight=2)
    assert attempt.position == 0
    data = json.loads(cli("show", "geo", "--json").stdout)
    [window] = data["rates"]
    assert window["available"] == 0
    assert [(w["task_id"], w["why"]) for w in data["waiter_list"]] == [("t9", None)]
    [why] = json.loads(cli("explain", "t9", "--json").stdout)
    assert (why["free"], why["needed"], why["why"]) == (1, 1, None)
    assert "held by the rate" not in cli("explain", "t9").stdout

    sem.withdraw("t9:0")
    attempt = sem.try_acquire("t8:0", owner=owner("t8"), place_ttl=120)
    assert attempt.position == 0
    data = json.loads(cli("show", "geo", "--json").stdout)
    [waiter] = data["waiter_list"]
    assert waiter["why"]["kind"] == "rate"
    assert waiter["why"]["text"].startswith("held by the rate 4/m: the window opens in ")


NOW = 1_000_000.0


def test_a_pause_and_a_full_window_are_both_named() -> None:
    """Built by hand: the pause ends in 2 s, the window opens in 5 s; the head waits for
    both, so it is said to, and its estimate is the later of the two."""
    waiter = WaiterInfo("w:0", 0, 1, NOW - 3, 30.0, False, {"task_id": "w"}, "")
    snap = Snapshot(
        name="geo",
        limit=10,
        limit_override=None,
        used=2,
        server_time=NOW,
        waiters=[waiter],
        rates=[RateWindowInfo(Rate(2, 10.0), 2, 5.0)],
        adaptive_limit=5,
        paused_for=2.0,
        throttles_total=3,
        last_throttle_age=0.5,
    )
    why = views.held_by(snap, waiter, 5)
    assert why is not None
    assert (why["kind"], why["ends_in"], why["pause_ends_in"]) == ("pause", 5.0, 2.0)
    assert why["text"] == (
        "held by a throttle pause: it ends in 2.0s; and held by the rate 2/10s: the window "
        "opens in 5.0s"
    )
    entry = Known("geo", {"proj.geo": (10, 1)})
    explained = views.explain(entry, snap, "w")
    assert explained is not None
    assert explained["estimate"] == 5.0
    assert explained["estimate_basis"] == (
        "its units are free: it starts when the throttle pause ends and the rate 2/10s has room"
    )
    lines = cli_render.limit_lines(views.summary(entry, snap))
    assert lines[0] == (
        "effective limit 5 of 10: lowered after 3 throttle(s), the last 0.5s ago, rising by 1 "
        "per 5 unit(s) of finished work; paused 2.0s more"
    )
    assert lines[1] == "rate 2/10s: 2 started, 0 available, opens in 5.0s"
    # a heavy head under a lowered limit, nothing held: it may start alone, so the pause holds it
    heavy = WaiterInfo("h:0", 0, 7, NOW - 3, 30.0, False, {"task_id": "h"}, "")
    empty = Snapshot(
        name="geo", limit=10, limit_override=None, used=0, server_time=NOW, waiters=[heavy],
        adaptive_limit=5, paused_for=2.0, throttles_total=3, last_throttle_age=0.5,
    )  # fmt: skip
    alone = views.held_by(empty, heavy, 5)
    assert alone is not None
    assert alone["kind"] == "pause"
    assert views.held_by(empty, heavy, 10) is not None  # not lowered: 7 of 10 fit anyway
    crowded = Snapshot(
        name="geo", limit=10, limit_override=None, used=1, server_time=NOW, waiters=[heavy],
        adaptive_limit=5, paused_for=2.0, throttles_total=3, last_throttle_age=0.5,
    )  # fmt: skip
    assert views.held_by(crowded, heavy, 5) is None  # 7 > 4 free and not alone: the units


# -- set-limit --rate -------------------------------------------------------------------------


def rate_audits(client: redis.Redis, prefix: str, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in audit.read(client, prefix, name, limit=20)
        if e["action"] in ("set-rate", "clear-rate")
    ]


def test_set_limit_rate_stores_shows_and_clears_a_runtime_rate(
    cli: Cli, make_semaphore: SemaphoreFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    sem = make_semaphore("geo", 10, rate="100/s")
    assert sem.acquire(owner=owner("h1"), blocking=False) is not None  # stores its rate=
    assert sem.inspect().rate_override is None

    result = cli("set-limit", "geo", "--rate", "2/m", "--rate", "50/h")
    assert result.exit_code == 0, result.output
    assert sem.inspect().rate_override == [Rate(2, 60.0), Rate(50, 3600.0)]
    assert sem.inspect().limit_override is None  # the limit is untouched
    assert "semaphore 'geo': rate set to 2/m, 50/h (runtime override; was 100/s from the " in (
        result.stdout
    )
    data = json.loads(cli("show", "geo", "--json").stdout)
    assert data["rate"] == {"rate": "2/m, 50/h", "source": "override", "override": ["2/m", "50/h"]}
    assert "\n  rate 2/m (runtime override): 1 started, 1 available" in cli("show", "geo").stdout
    # an acquirer's own rate= does not replace the override
    assert sem.acquire(owner=owner("h2"), blocking=False) is not None
    assert sem.inspect().rate_override == [Rate(2, 60.0), Rate(50, 3600.0)]

    [entry] = rate_audits(redis_client, key_prefix, "geo")
    assert entry["action"] == "set-rate"
    assert entry["detail"] == {
        "rate": "2/m, 50/h",
        "previous": "100/s",
        "previous_source": "acquirers",
    }

    result = cli("set-limit", "geo", "--rate", "none")
    assert result.exit_code == 0, result.output
    assert sem.inspect().rate_override is None
    assert "runtime rate cleared (was 2/m, 50/h from a runtime override)" in result.stdout
    cleared, _ = rate_audits(redis_client, key_prefix, "geo")
    assert cleared["action"] == "clear-rate"
    assert cleared["detail"]["previous"] == "2/m, 50/h"
    assert cleared["detail"]["rate"] is None

    # the limit and the rate at once; --clear-rate clears too; commas separate windows
    result = cli("set-limit", "geo", "7", "--rate", "5/s,100/m")
    assert result.exit_code == 0, result.output
    snap = sem.inspect()
    assert (snap.limit_override, snap.rate_override) == (7, [Rate(5, 1.0), Rate(100, 60.0)])
    assert cli("set-limit", "geo", "--clear-rate").exit_code == 0
    snap = sem.inspect()
    assert (snap.limit_override, snap.rate_override) == (7, None)
    actions = [e["action"] for e in audit.read(redis_client, key_prefix, "geo", limit=20)]
    assert actions == ["clear-rate", "set-rate", "set-limit", "clear-rate", "set-rate"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "bogus"], "rate='bogus' is not accepted: use \"N/period\""),
        (["--rate", "0/s"], "rate='0/s' is not accepted: the count must be an int"),
        (["--rate", "1/2d"], "rate='1/2d' is not accepted: it is below one start per day"),
        (
            ["--rate", "none", "--rate", "5/s"],
            "rate='none, 5/s' is not accepted: 'none' (clear the runtime rate) cannot be given",
        ),
    ],
)
def test_a_bad_rate_changes_nothing_and_names_the_value(
    cli: Cli, make_semaphore: SemaphoreFactory, redis_client: redis.Redis, key_prefix: str,
    args: list[str], message: str,
) -> None:  # fmt: skip
    sem = make_semaphore("geo", 10)
    sem.set_rate_override("3/s")
    result = cli("set-limit", "geo", *args)
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.stderr.startswith(f"celery semaphore: error: {message}"), result.stderr
    assert result.stderr.rstrip().endswith("; nothing changed")
    assert sem.inspect().rate_override == [Rate(3, 1.0)]
    assert rate_audits(redis_client, key_prefix, "geo") == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "5/s", "--clear-rate"], "give either --rate or --clear-rate, not both"),
        ([], "give a LIMIT (an int >= 1), --clear, --rate, --clear-rate or --clear-throttle"),
        (["3", "--clear"], "give either a LIMIT (an int >= 1) or --clear, not both"),
    ],
)
def test_set_limit_usage(cli: Cli, args: list[str], message: str) -> None:
    result = cli("set-limit", "geo", *args)
    assert result.exit_code == EXIT_USAGE
    assert message in result.output


def test_a_pattern_sets_the_rate_of_every_match(
    redis_url: str, key_prefix: str, make_semaphore: SemaphoreFactory
) -> None:
    app = make_app(redis_url, key_prefix)
    for name in ("llm:a", "llm:b", "db"):

        @app.task(name=f"pat.{name}", shared=False)
        @limited(name, limit=3)
        def task() -> None: ...

    try:
        dry = run_cli(app, "set-limit", "llm:*", "--rate", "60/m", "--dry-run")
        assert dry.exit_code == 0, dry.output
        assert "dry run: would set the rate to 60/m on 2 semaphore(s); nothing changed" in (
            dry.stdout
        )
        assert make_semaphore("llm:a", 3).inspect().rate_override is None
        result = run_cli(app, "set-limit", "llm:*", "--rate", "60/m", "--yes")
        assert result.exit_code == 0, result.output
        overrides = {n: make_semaphore(n, 3).inspect().rate_override for n in ("llm:a", "llm:b")}
        assert overrides == {"llm:a": [Rate(60, 60.0)], "llm:b": [Rate(60, 60.0)]}
        assert make_semaphore("db", 3).inspect().rate_override is None
    finally:
        app.close()


def test_the_web_page_shows_the_effective_limit_and_sets_the_rate(
    app: Celery, make_semaphore: SemaphoreFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    from pathlib import Path

    from celery_semaphore.ops import web

    from .test_web_app import request

    sem, _ = lowered_geo(make_semaphore)
    port = closed_port()
    server, _ = web.start_server(app, port=port, token="tok")

    def post(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        status, _, raw = request(
            url + "/api/actions/set-rate",
            method="POST",
            body=json.dumps({"name": "geo", **body}).encode(),
            headers={"X-Semaphore-Token": "tok"},
        )
        return status, json.loads(raw)

    try:
        url = f"http://127.0.0.1:{port}"
        rows = json.loads(request(url + "/api/semaphores")[2])["semaphores"]
        geo = next(r for r in rows if r["name"] == "geo")
        assert (geo["effective"]["limit"], geo["effective"]["of"]) == (5, 10)
        assert geo["effective"]["text"].startswith("effective limit 5 of 10: lowered after 1 ")

        status, body = post({"rate": "10/s", "operator": "ann"})
        assert status == 200, body
        assert body["after"]["rate"] == "10/s"
        assert sem.inspect().rate_override == [Rate(10, 1.0)]
        detail = json.loads(request(url + "/api/semaphore?name=geo")[2])
        assert detail["rate"]["source"] == "override"
        [entry] = rate_audits(redis_client, key_prefix, "geo")
        assert (entry["detail"]["via"], entry["detail"]["operator"]) == ("web", "ann")

        status, body = post({"rate": ["bogus"]})
        assert status == 400
        assert body["error"].startswith("rate='bogus' is not accepted")
        status, body = post({"rate": 5})
        assert (status, body["error"]) == (
            400,
            'rate=5: give a rate such as "10/s", a list of them, or null to clear',
        )
        assert sem.inspect().rate_override == [Rate(10, 1.0)]

        status, body = post({"rate": None})
        assert status == 200, body
        assert sem.inspect().rate_override is None
        assert [e["action"] for e in rate_audits(redis_client, key_prefix, "geo")] == [
            "clear-rate",
            "set-rate",
        ]
    finally:
        server.shutdown()
        server.server_close()
    script = (Path(web.__file__).parent / "web_static" / "app.js").read_text(encoding="utf-8")
    for needle in ("effectiveText(s)", "effectiveText(d)", '"set-rate"', "row.effective.text"):
        assert needle in script, needle


def test_clear_throttle_ends_the_pause_and_restores_the_limit(
    cli: Cli, make_semaphore: SemaphoreFactory, redis_client: Any, key_prefix: str
) -> None:
    sem, permits = lowered_geo(make_semaphore)
    permits[1].throttled(retry_after=600)
    snap = sem.inspect()
    assert snap.paused_for is not None
    assert snap.paused_for > 500
    assert snap.effective_limit == 5
    result = cli("set-limit", "geo", "--clear-throttle")
    assert result.exit_code == 0, result.output
    assert "throttle pause ended and lowered limit restored" in result.stdout
    snap = sem.inspect()
    assert (snap.paused_for, snap.adaptive_limit, snap.effective_limit) == (None, None, 10)
    # the units are free again: a new start is granted at once
    assert sem.acquire(owner=owner("new"), blocking=False) is not None
    entries = [
        e for e in audit.read(redis_client, key_prefix, "geo") if e["action"] == "clear-throttle"
    ]
    assert len(entries) == 1
    assert entries[0]["detail"]["previous"] == 5
    again = cli("set-limit", "geo", "--clear-throttle")
    assert "nothing to clear" in again.stdout
