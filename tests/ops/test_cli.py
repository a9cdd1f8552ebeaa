"""Every ``celery semaphore`` command through click's CliRunner, against the real Redis.

The semaphores' state is made with the core API (holders and waiters with owner metadata as
the Celery layer writes it); the live-worker versions are in test_live_workers.py.
"""

from __future__ import annotations

import getpass
import json
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from celery_semaphore.core.connection import check
from celery_semaphore.integration.signals import check_app
from celery_semaphore.ops import audit, registry
from celery_semaphore.ops.cli import EXIT_CANCELLED, EXIT_NOT_FOUND, EXIT_REDIS, EXIT_USAGE
from celery_semaphore.ops.testing import RedisServer, start_redis_server
from tests.conftest import SemaphoreFactory
from tests.route import unavailable

from .conftest import Cli, make_app, run_cli


def owner(task_id: str, task: str = "ops.one", host: str = "w1@test", pid: int = 4242) -> Any:
    return {"task_id": task_id, "task": task, "host": host, "pid": pid, "machine": "test"}


def rows_of(result: Any) -> dict[str, Any]:
    assert result.exit_code == 0, result.output
    return {row["name"]: row for row in json.loads(result.stdout)}


def single_error_line(result: Any) -> str:
    """stderr must be exactly one line, without a traceback."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    assert lines[0].startswith("celery semaphore: error: ")
    return str(lines[0])


# -- list ---------------------------------------------------------------------------------------


def test_list_shows_every_semaphore_with_its_limit_and_source(
    cli: Cli, make_semaphore: SemaphoreFactory
) -> None:
    make_semaphore("alpha", 3).acquire(owner=owner("t1"))
    loose = make_semaphore("loose", 5)  # used without Celery: only SCAN finds it
    loose.acquire(owner=owner("t9"))
    loose.try_acquire("w1", owner=owner("t10"), place_ttl=60, weight=5)

    rows = rows_of(cli("list", "--json"))
    # (Celery adds the shared tasks of modules other tests imported to every app, so more
    # semaphores may be listed; none of them has state under this test's prefix.)
    assert {"alpha", "beta", "loose"} <= set(rows)
    alpha, beta, found = rows["alpha"], rows["beta"], rows["loose"]
    assert (alpha["limit"], alpha["source"], alpha["code"]) == (3, "code", 3)
    assert (alpha["used"], alpha["holders"], alpha["waiting"]) == (1, 1, 0)
    assert alpha["tasks"] == ["ops.one", "ops.two"]
    assert (beta["limit"], beta["source"], beta["setting"], beta["code"]) == (4, "setting", 4, 2)
    assert (found["limit"], found["source"], found["found_in"]) == (None, "unknown", ["redis"])
    assert (found["used"], found["waiting"]) == (1, 1)

    text = cli("list").stdout
    assert text.splitlines()[0].split() == [
        "NAME", "LIMIT", "FROM", "IN", "USE", "HOLDERS", "WAITING", "OLDEST", "TASKS"
    ]  # fmt: skip
    alpha_line = next(line for line in text.splitlines() if line.startswith("alpha"))
    assert alpha_line.split()[:6] == ["alpha", "3", "code", "1/3", "1", "0"]
    assert "setting" in next(line for line in text.splitlines() if line.startswith("beta"))

    assert "loose" not in rows_of(cli("list", "--json", "--no-scan"))


def test_list_includes_semaphores_registered_by_workers(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    # an app that has none of the tasks: it learns them from the registry the workers wrote
    bare = make_app(redis_url, key_prefix)
    uses = [registry.TaskUse("gamma", "proj.g1", 7), registry.TaskUse("gamma", "proj.g2", 7, 2)]
    registry.record(redis_client, key_prefix, uses, settings={"gamma": 5}, node="w9@host")
    rows = rows_of(run_cli(bare, "list", "--json"))
    gamma = rows["gamma"]
    assert (gamma["limit"], gamma["source"], gamma["code"], gamma["setting"]) == (
        5,
        "setting",
        7,
        5,
    )
    assert gamma["tasks"] == ["proj.g1", "proj.g2"]
    assert (gamma["recorded_by"], gamma["found_in"]) == ("w9@host", ["registry"])
    bare.close()


# -- set-limit ------------------------------------------------------------------------------------


def test_set_limit_is_a_runtime_override_obeyed_and_visible(
    cli: Cli, make_semaphore: SemaphoreFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    result = cli("set-limit", "alpha", "1")
    assert result.exit_code == 0, result.output
    assert "limit set to 1 (runtime override; was 3 from code)" in result.stdout
    alpha = rows_of(cli("list", "--json"))["alpha"]
    assert (alpha["limit"], alpha["source"], alpha["override"], alpha["code"]) == (
        1,
        "override",
        1,
        3,
    )
    # a client that declares limit 3 obeys it
    sem = make_semaphore("alpha", 3)
    permit = sem.acquire(blocking=False)
    assert permit is not None
    assert sem.acquire(blocking=False) is None
    permit.release()

    result = cli("set-limit", "alpha", "--clear")
    assert result.exit_code == 0, result.output
    assert "runtime override cleared" in result.stdout
    alpha = rows_of(cli("list", "--json"))["alpha"]
    assert (alpha["limit"], alpha["source"], alpha["override"]) == (3, "code", None)
    actions = audit.read(redis_client, key_prefix, "alpha")
    assert [a["action"] for a in actions] == ["clear-limit", "set-limit"]
    assert actions[1]["detail"] == {"limit": 1, "previous": 3, "previous_source": "code"}


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["set-limit", "alpha"], EXIT_USAGE),
        (["set-limit", "alpha", "2", "--clear"], EXIT_USAGE),
        (["set-limit", "alpha", "0"], EXIT_USAGE),
        (["set-limit", "alpha", "two"], EXIT_USAGE),
        (["set-limit", "nope", "2"], EXIT_NOT_FOUND),
        (["show", "nope"], EXIT_NOT_FOUND),
        (["release", "alpha"], EXIT_USAGE),
        (["release", "alpha", "tok", "--task-id", "t1"], EXIT_USAGE),
        (["release", "alpha", "no-such-token"], EXIT_NOT_FOUND),
        (["release", "nope", "tok"], EXIT_NOT_FOUND),
        (["reset", "nope", "--yes"], EXIT_NOT_FOUND),
        (["explain", "no-such-task"], EXIT_NOT_FOUND),
        (["top", "--iterations", "-1"], EXIT_USAGE),
    ],
)
def test_bad_input_exits_with_the_documented_code(cli: Cli, args: list[str], code: int) -> None:
    result = cli(*args)
    assert result.exit_code == code, result.output
    if code == EXIT_NOT_FOUND:
        single_error_line(result)
    assert "Traceback" not in result.output


def test_unknown_name_error_says_what_was_searched(cli: Cli, key_prefix: str) -> None:
    line = single_error_line(cli("show", "nope"))
    assert f"unknown semaphore 'nope' under key prefix {key_prefix!r}" in line


# -- show -----------------------------------------------------------------------------------------


def fill_alpha(make_semaphore: SemaphoreFactory) -> Any:
    """alpha (limit 3): t1 (1 unit) and t2 (2 units) hold; t3 blocks and t4 is parked."""
    sem = make_semaphore("alpha", 3)
    p1 = sem.acquire(owner=owner("t1", host="w1@a", pid=11))
    p2 = sem.acquire(owner=owner("t2", task="ops.two", host="w2@b", pid=22), weight=2)
    sem.try_acquire("t3:0", owner=owner("t3"), place_ttl=60, weight=2)
    sem.try_acquire("t4:0", owner=owner("t4"), place_ttl=60, wake_data="{}")
    return sem, p1, p2


def test_show_lists_holders_and_waiters(cli: Cli, make_semaphore: SemaphoreFactory) -> None:
    _, p1, p2 = fill_alpha(make_semaphore)
    result = cli("show", "alpha", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    holders = {h["task_id"]: h for h in data["holder_list"]}
    assert set(holders) == {"t1", "t2"}
    h1, h2 = holders["t1"], holders["t2"]
    assert (h1["token"], h1["host"], h1["pid"], h1["weight"]) == (p1.token, "w1@a", 11, 1)
    assert (h2["token"], h2["task"], h2["weight"], h2["fencing_token"]) == (
        p2.token,
        "ops.two",
        2,
        p2.fencing_token,
    )
    assert 0 <= h1["age"] < 30
    assert 30 < h1["lease_left"] <= 60
    waiters = data["waiter_list"]
    assert [(w["task_id"], w["position"], w["parked"]) for w in waiters] == [
        ("t3", 0, False),
        ("t4", 1, True),
    ]
    assert all(w["waited"] >= 0 and w["partition"] == "" for w in waiters)

    text = cli("show", "alpha").stdout
    assert text.startswith("semaphore 'alpha': limit 3 (code)")
    assert "in use: 3 of 3 unit(s) by 2 holder(s); 2 waiting" in text
    assert "HOLDERS (2)" in text
    assert "WAITERS (2)" in text
    waiter_lines = text.split("WAITERS (2)")[1].strip().splitlines()
    assert waiter_lines[1].split()[:3] == ["0", "t3", "ops.one"]
    assert waiter_lines[1].endswith("slot     semaphore full: 3 of 3 unit(s) in use, 0 free")
    assert "parked in the broker  semaphore full" in waiter_lines[2]


def test_show_says_how_each_waiter_waits(cli: Cli, make_semaphore: SemaphoreFactory) -> None:
    """One vocabulary (docs/cli.md): held by a worker, in a slot, parked, a direct acquire."""
    sem = make_semaphore("ways", 1)
    assert sem.acquire(owner=owner("holder")) is not None
    held = {**owner("h"), "held_by": "celery@node-7"}
    sem.try_acquire("h:0", owner=held, place_ttl=60, wake_data="@gate-list")
    sem.try_acquire("s:0", owner=owner("s"), place_ttl=60)
    sem.try_acquire("p:0", owner=owner("p"), place_ttl=60, wake_data="{}")
    sem.try_acquire("d:0", owner={"host": "script"}, place_ttl=60)
    data = json.loads(cli("show", "ways", "--json").stdout)
    assert [(w["ticket"], w["how"], w["held_by"]) for w in data["waiter_list"]] == [
        ("h:0", "held by a worker", "celery@node-7"),
        ("s:0", "waiting in a slot", None),
        ("p:0", "parked in the broker", None),
        ("d:0", "blocked (direct acquire)", None),
    ]
    text = cli("show", "ways").stdout
    first = text.split("WAITERS (4)")[1].splitlines()[2]
    assert "held by celery@node-7     semaphore full" in first
    explained = cli("explain", "h").stdout
    assert "held by a worker (celery@node-7), off the pool" in explained


# -- explain --------------------------------------------------------------------------------------


def test_explain_a_waiting_task(cli: Cli, make_semaphore: SemaphoreFactory) -> None:
    fill_alpha(make_semaphore)
    result = cli("explain", "t4", "--json")
    assert result.exit_code == 0, result.output
    [why] = json.loads(result.stdout)
    assert (why["name"], why["state"], why["waiter"]["position"]) == ("alpha", "waiting", 1)
    assert [w["task_id"] for w in why["ahead"]] == ["t3"]
    # 2 units ahead + its own 1, none free: 3 units must come free first
    assert (why["ahead_units"], why["free"], why["needed"]) == (2, 0, 3)
    assert why["cap"] == {"kind": "limit", "limit": 3, "source": "code"}
    assert why["estimate"] is not None
    assert why["estimate"] >= 0
    assert "mean age" in why["estimate_basis"]
    assert sorted(h["task_id"] for h in why["holders"]) == ["t1", "t2"]

    text = cli("explain", "t4").stdout
    assert text.startswith(
        "task t4 (ops.one) waits for semaphore 'alpha' because the semaphore is full: 3 unit(s) "
        "of its limit 3 are in use and 0 free, and it needs 1; the 1 waiter(s) ahead of it in "
        "its line need 2 more.\n"
    )
    assert "place in line: 1 (0 is the head); 1 waiter(s) ahead need 2 unit(s)" in text
    assert "cap: the semaphore's limit, 3 (code)" in text
    assert "estimate: about" in text
    assert "parked" in text


def test_explain_estimates_from_the_average_hold_of_recent_releases(
    cli: Cli, make_semaphore: SemaphoreFactory
) -> None:
    sem = make_semaphore("alpha", 3)
    for _ in range(3):  # some history: holds of about 0.2 s
        permit = sem.acquire(blocking=False)
        assert permit is not None
        time.sleep(0.2)
        permit.release()
    average = sem.inspect().hold_time_avg
    assert average is not None
    assert 0.19 <= average < 0.5
    fill_alpha(make_semaphore)
    [why] = json.loads(cli("explain", "t4", "--json").stdout)
    assert why["estimate_basis"] == "the average hold time of recent releases"
    assert why["hold_estimate"] == round(average, 3)
    # 3 units must come free, 3 turn over per average hold
    assert why["estimate"] == round(3 * average / 3, 1)
    text = cli("explain", "t4").stdout
    assert "the average hold time of recent releases" in text

    data = json.loads(cli("show", "alpha", "--json").stdout)
    assert (data["hold_time_avg"], data["reclaimed_total"], data["grants_total"]) == (
        round(average, 3),
        0,
        5,
    )
    shown = cli("show", "alpha").stdout
    assert "held on average: 0." in shown
    assert "(recent releases); 0 lease(s) expired and taken back; 5 permit(s) granted" in shown


def test_forced_releases_do_not_count_as_hold_times(
    cli: Cli, make_semaphore: SemaphoreFactory
) -> None:
    sem, p1, _ = fill_alpha(make_semaphore)
    assert cli("release", "alpha", p1.token, "--yes").exit_code == 0
    assert sem.inspect().hold_time_avg is None
    assert cli("reset", "alpha", "--yes").exit_code == 0
    snap = sem.inspect()
    assert (snap.used, snap.hold_time_avg) == (0, None)


def test_show_counts_expired_leases(cli: Cli, make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("alpha", 3, lease_ttl=0.2)
    assert sem.acquire(blocking=False) is not None
    fresh = json.loads(cli("show", "alpha", "--json").stdout)
    assert (fresh["hold_time_avg"], fresh["reclaimed_total"]) == (None, 0)
    assert "held on average: - (nothing released yet); 0 lease(s)" in cli("show", "alpha").stdout
    time.sleep(0.3)
    assert make_semaphore("alpha", 3).acquire(blocking=False) is not None  # takes it back
    data = json.loads(cli("show", "alpha", "--json").stdout)
    assert (data["hold_time_avg"], data["reclaimed_total"]) == (None, 1)
    [row] = [r for r in json.loads(cli("list", "--json").stdout) if r["name"] == "alpha"]
    assert row["reclaimed_total"] == 1


def test_explain_a_holding_task_and_one_not_there(
    cli: Cli, make_semaphore: SemaphoreFactory
) -> None:
    _, p1, _ = fill_alpha(make_semaphore)
    [why] = json.loads(cli("explain", "t1", "--json").stdout)
    assert (why["state"], why["holding"][0]["token"]) == ("holding", p1.token)
    assert "holds semaphore 'alpha'" in cli("explain", "t1").stdout
    result = cli("explain", "t4", "--name", "beta")
    assert result.exit_code == EXIT_NOT_FOUND
    assert "neither holding nor waiting for semaphore 'beta'" in single_error_line(result)


# -- release --------------------------------------------------------------------------------------


def test_forced_release_by_token_and_task_id_is_logged_with_who(
    cli: Cli,
    make_semaphore: SemaphoreFactory,
    redis_client: redis.Redis,
    key_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sem, p1, p2 = fill_alpha(make_semaphore)
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    with caplog.at_level(logging.WARNING, logger="celery_semaphore.cli"):
        result = cli("release", "alpha", p1.token, "--yes")
    assert result.exit_code == 0, result.output
    assert f"released token {p1.token} (task t1, 1 unit(s))" in result.stdout
    [record] = [r for r in caplog.records if r.name == "celery_semaphore.cli"]
    assert record.levelno == logging.WARNING
    assert who in record.getMessage()
    assert p1.token in record.getMessage()
    assert sorted(h.token for h in sem.holders()) == [p2.token]

    result = cli("release", "alpha", "--task-id", "t2", "--yes")
    assert result.exit_code == 0, result.output
    # the freed units are owed to the waiters, which take them on their next call
    assert sem.holders() == []
    assert p1.refresh() is False  # the released holder finds its permit gone

    entries = audit.read(redis_client, key_prefix, "alpha")
    assert [(e["action"], e["detail"]["task_id"]) for e in entries] == [
        ("release", "t2"),
        ("release", "t1"),
    ]
    assert f"{entries[0]['user']}@{entries[0]['host']}" == who
    assert (entries[1]["detail"]["holder_host"], entries[1]["detail"]["holder_pid"]) == (
        "w1@a",
        11,
    )

    again = cli("release", "alpha", p1.token, "--yes")
    assert again.exit_code == EXIT_NOT_FOUND
    assert f"no holder of semaphore 'alpha' has token {p1.token}" in single_error_line(again)


def test_release_asks_first_and_a_no_or_no_answer_releases_nothing(
    cli: Cli, make_semaphore: SemaphoreFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    sem, p1, p2 = fill_alpha(make_semaphore)
    declined = cli("release", "alpha", p2.token, input="n\n")
    assert declined.exit_code == EXIT_CANCELLED
    assert "Force-release 1 permit(s) (2 unit(s)) of semaphore 'alpha'?" in declined.stdout
    assert "release cancelled" in single_error_line(declined)
    no_tty = cli("release", "alpha", "--task-id", "t1")  # no answer at all: cancelled
    assert no_tty.exit_code == EXIT_CANCELLED
    assert sorted(h.token for h in sem.holders()) == sorted([p1.token, p2.token])
    assert audit.read(redis_client, key_prefix, "alpha") == []
    done = cli("release", "alpha", p2.token, input="y\n")
    assert done.exit_code == 0, done.output
    assert [h.token for h in sem.holders()] == [p1.token]


def test_release_of_a_waiting_task_says_where_it_waits(
    cli: Cli, make_semaphore: SemaphoreFactory
) -> None:
    fill_alpha(make_semaphore)
    result = cli("release", "alpha", "--task-id", "t4", "--yes")
    assert result.exit_code == EXIT_NOT_FOUND
    assert "(it is waiting, at position 1)" in single_error_line(result)


# -- reset ----------------------------------------------------------------------------------------


def test_reset_asks_first_and_keeps_override_and_fencing(
    cli: Cli, make_semaphore: SemaphoreFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    sem, _, p2 = fill_alpha(make_semaphore)
    sem.set_limit_override(3)
    before = sem.inspect()

    declined = cli("reset", "alpha", input="n\n")
    assert declined.exit_code == EXIT_CANCELLED
    assert "drop 2 holder(s) (3 unit(s)) and 2 waiter(s)?" in declined.stdout
    assert "reset cancelled" in single_error_line(declined)
    assert (len(sem.holders()), len(sem.waiters())) == (2, 2)
    no_tty = cli("reset", "alpha")  # no answer at all: cancelled, not done
    assert no_tty.exit_code == EXIT_CANCELLED
    assert sem.inspect().used == before.used

    done = cli("reset", "alpha", input="y\n")
    assert done.exit_code == 0, done.output
    assert "released 2 holder(s), withdrew 2 waiter(s)" in done.stdout
    after = sem.inspect()
    assert (after.used, after.holders, after.waiters, after.limit_override) == (0, [], [], 3)
    fresh = sem.acquire(blocking=False)
    assert fresh is not None
    assert fresh.fencing_token > p2.fencing_token
    fresh.release()
    assert audit.read(redis_client, key_prefix, "alpha")[0]["action"] == "reset"


def test_reset_yes_forget_removes_the_registry_entry(
    cli: Cli, make_semaphore: SemaphoreFactory, redis_client: redis.Redis, key_prefix: str
) -> None:
    registry.record(redis_client, key_prefix, [registry.TaskUse("alpha", "ops.one", 3)])
    make_semaphore("alpha", 3).acquire(owner=owner("t1"))
    assert "alpha" in registry.read(redis_client, key_prefix)
    result = cli("reset", "alpha", "--yes", "--forget")
    assert result.exit_code == 0, result.output
    assert "removed from the registry" in result.stdout
    assert "alpha" not in registry.read(redis_client, key_prefix)
    assert make_semaphore("alpha", 3).inspect().used == 0


# -- top ------------------------------------------------------------------------------------------


def test_top_draws_a_bar_per_semaphore_each_refresh(
    cli: Cli, make_semaphore: SemaphoreFactory
) -> None:
    make_semaphore("alpha", 3).acquire(owner=owner("t1"))
    result = cli("top", "--iterations", "2", "--interval", "0.05")
    assert result.exit_code == 0, result.output
    frames = result.stdout.split("celery semaphore top")[1:]
    assert len(frames) == 2
    for frame in frames:
        alpha = next(line for line in frame.splitlines() if line.startswith("alpha"))
        assert "[" + "#" * 10 + "." * 20 + "]" in alpha  # 1 of 3 units on a 30-wide bar
        assert "1/3 in use" in alpha
        beta = next(line for line in frame.splitlines() if line.startswith("beta"))
        assert "[" + "." * 30 + "]" in beta

    lines = cli("top", "--iterations", "2", "--interval", "0.05", "--json").stdout.splitlines()
    assert len(lines) == 2
    rows = {r["name"]: r for r in json.loads(lines[1])["semaphores"]}
    assert (rows["alpha"]["used"], rows["alpha"]["limit"]) == (1, 3)


# -- audit ----------------------------------------------------------------------------------------


def test_audit_lists_operator_actions(cli: Cli) -> None:
    assert cli("set-limit", "beta", "9").exit_code == 0
    result = cli("audit", "--json")
    [entry] = json.loads(result.stdout)
    assert (entry["action"], entry["name"], entry["detail"]["limit"]) == ("set-limit", "beta", 9)
    assert entry["user"] == getpass.getuser()
    assert entry["host"] == socket.gethostname()
    assert "set-limit 'beta' by" in cli("audit").stdout
    assert cli("audit", "alpha").stdout.strip() == "no operator actions recorded for 'alpha'"


# -- Redis trouble --------------------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    "args",
    [["list"], ["show", "alpha"], ["explain", "t1"], ["top", "--iterations", "1"], ["audit"]],
)
def test_unreachable_redis_is_one_line_and_exit_3(args: list[str]) -> None:
    url = f"redis://:secret@127.0.0.1:{closed_port()}/0"
    app = make_app(url, "cs-nowhere")
    result = run_cli(app, *args)
    assert result.exit_code == EXIT_REDIS, result.output
    line = single_error_line(result)
    assert "cannot reach Redis at redis://:***@127.0.0.1:" in line
    assert "secret" not in result.output
    app.close()


def test_invalid_configuration_is_one_line_and_exit_2(redis_url: str, key_prefix: str) -> None:
    app = make_app(redis_url, key_prefix, semaphore_limits={"alpha": 0})
    result = run_cli(app, "list")
    assert result.exit_code == EXIT_USAGE
    line = single_error_line(result)
    assert "invalid configuration: semaphore_limits['alpha']=0 is not accepted" in line
    app.close()


# -- a Redis that requires a password: the CLI says the credentials were refused --------------

PASSWORD = "cs-s3cret-pass"


@pytest.fixture(scope="module")
def password_redis() -> Iterator[RedisServer]:
    """A throwaway redis-server of our own that requires ``PASSWORD`` (set after it started:
    never on the shared server)."""
    try:
        server = start_redis_server()
    except (RuntimeError, OSError) as exc:
        unavailable(f"cannot start a redis-server: {exc}")
    try:
        client = server.client()
        client.config_set("requirepass", PASSWORD)
        client.close()
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("args", [["list"], ["show", "alpha"], ["audit"]])
def test_a_wrong_password_is_said_to_be_rejected_not_unreachable(
    password_redis: RedisServer, args: list[str]
) -> None:
    port = password_redis.port
    app = make_app(f"redis://:wrong-pass@127.0.0.1:{port}/0", "cs-auth")
    result = run_cli(app, *args)
    assert result.exit_code == EXIT_REDIS, result.output
    line = single_error_line(result)
    assert line.startswith(
        f"celery semaphore: error: Redis at redis://:***@127.0.0.1:{port}/0 rejected the "
        "credentials (invalid username-password pair or user is disabled.): the server is "
        "reachable, but the user name or password is wrong"
    ), line
    assert "cannot reach" not in line
    assert "wrong-pass" not in result.output
    app.close()


def test_a_missing_password_is_said_to_be_required(password_redis: RedisServer) -> None:
    port = password_redis.port
    app = make_app(f"redis://127.0.0.1:{port}/0", "cs-auth")
    line = single_error_line(result := run_cli(app, "list"))
    assert result.exit_code == EXIT_REDIS
    assert line.startswith(
        f"celery semaphore: error: Redis at redis://127.0.0.1:{port}/0 requires a password and "
        "none was given ("
    ), line
    assert "put it in the URL (redis://:PASSWORD@host:6379/0" in line
    app.close()


def test_the_right_password_works(password_redis: RedisServer) -> None:
    app = make_app(f"redis://:{PASSWORD}@127.0.0.1:{password_redis.port}/0", "cs-auth")
    result = run_cli(app, "list", "--json")
    assert result.exit_code == 0, result.output
    app.close()


# -- the CLI refuses what a worker refuses, in the same words ----------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["list"],
        ["show", "alpha"],
        ["explain", "t1"],
        ["set-limit", "alpha", "3"],
        ["release", "alpha", "tok"],
        ["reset", "alpha", "--yes"],
        ["top", "--iterations", "1"],
        ["audit"],
        ["metrics", "--port", "1"],
    ],
)
def test_a_misspelt_setting_that_a_worker_refuses_stops_every_command(
    redis_url: str, key_prefix: str, args: list[str]
) -> None:
    app = make_app(redis_url, key_prefix, semaphore_redis_uri=redis_url)
    result = run_cli(app, *args)
    assert result.exit_code == EXIT_USAGE, result.output
    line = single_error_line(result)
    with pytest.raises(ValueError, match="semaphore_redis_uri") as info:
        check_app(app)  # what the worker runs at start
    assert line == f"celery semaphore: error: invalid configuration: {info.value}"
    assert "unknown setting(s) semaphore_redis_uri (did you mean semaphore_redis_url?)" in line
    app.close()


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        (
            {"semaphore_limits": {"alpha": 1}},
            "task ops.two: weight=2 exceeds the limit of semaphore 'alpha' (1, from "
            "semaphore_limits); use a weight from 1 to 1 or raise the limit",
        ),
        (
            {"broker_transport_options": {"visibility_timeout": "soon"}},
            "broker_transport_options['visibility_timeout']='soon' is not accepted: use a "
            "number of seconds > 0 (how long the Redis broker waits before it delivers an "
            "unacknowledged message again; kombu's default is 3600)",
        ),
    ],
    ids=["weight-above-setting", "visibility-timeout"],
)
def test_the_cli_checks_the_tasks_and_broker_settings_as_a_worker_does(
    app: Celery, conf: dict[str, Any], message: str
) -> None:
    app.conf.update(conf)
    result = run_cli(app, "list")
    assert result.exit_code == EXIT_USAGE, result.output
    assert single_error_line(result) == f"celery semaphore: error: invalid configuration: {message}"


def test_no_redis_configured_is_one_line_and_exit_3() -> None:
    app = Celery("no-redis", broker="amqp://guest@127.0.0.1//", set_as_current=False)
    result = run_cli(app, "list")
    assert result.exit_code == EXIT_REDIS
    assert "celery-semaphore needs Redis: set semaphore_redis_url" in single_error_line(result)
    app.close()


def test_the_worker_start_check_says_the_credentials_were_refused(
    password_redis: RedisServer,
) -> None:
    """The check a worker makes at start words it as the CLI does (one function)."""
    url = f"redis://:wrong-{PASSWORD}@127.0.0.1:{password_redis.port}/0"
    with pytest.raises(ValueError, match="rejected the credentials") as info:
        check(url)
    assert f"Redis at redis://:***@127.0.0.1:{password_redis.port}/0" in str(info.value)
    assert PASSWORD not in str(info.value)
    with pytest.raises(ValueError, match="requires a password and none was given"):
        check(f"redis://127.0.0.1:{password_redis.port}/0")
