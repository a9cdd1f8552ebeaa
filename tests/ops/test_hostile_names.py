"""A semaphore name built from a task argument, a task id or an owner from any producer is
anyone's text: every surface shows it escaped (``logs.printable``), never interpreted by the
operator's terminal.  One test per surface: the CLI's text output (real Redis), the package's
log lines (the real loggers, and a real worker), the web page's JSON API and its script.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_semaphore import AttemptStatus, limited, logs
from tests.conftest import SemaphoreFactory
from tests.log_records import LogRecords

from .conftest import Cli
from .test_cli import closed_port, owner
from .test_logs import Bodies, bodies, on, records  # noqa: F401
from .test_logs import app as worker_app  # noqa: F401
from .test_web_app import request

#: a clear-screen sequence, a bare CR, a newline that would forge a row, a window title, a
#: bidi override, and a backslash
NAME = "evil\x1b[2J\r\n\x1b]0;x\x07\u202e\\end"
SHOWN = r"evil\x1b[2J\r\n\x1b]0;x\x07\u202e\\end"
TASK_ID = "t-1\x1b[31m\rforged\nrow"
TASK_SHOWN = r"t-1\x1b[31m\rforged\nrow"
WAITER_ID = "t-2\x9b2J\x7f"
WAITER_SHOWN = r"t-2\x9b2J\x7f"


def assert_safe(text: str) -> None:
    """Nothing a terminal would interpret: every character printable, or a line break."""
    bad = sorted({c for c in text if not (c.isprintable() or c == "\n")})
    assert not bad, f"raw {bad!r} in {text!r}"


def test_printable_escapes_what_a_terminal_interprets_and_keeps_the_rest() -> None:
    assert logs.printable(NAME) == SHOWN
    assert logs.printable("llm:acme café 東京") == "llm:acme café 東京"  # unchanged
    assert logs.printable("a\\x1b") == "a\\\\x1b"  # the four characters, not the escape
    assert logs.printable("\t\x00\x85\u2028\U000e0001") == r"\t\x00\x85\u2028\U000e0001"
    assert logs.printable(3) == "3"
    assert logs.printable("a\\\nb\x1b", keep="\n\\") == "a\\\nb\\x1b"


@pytest.fixture
def hostile(make_semaphore: SemaphoreFactory) -> Iterator[Any]:
    """``NAME`` with limit 1: a holder (``TASK_ID``, hostile task and host) and a waiter."""
    sem = make_semaphore(NAME, 1)
    held = sem.acquire(owner=owner(TASK_ID, task="proj.\x1b[2Jtask", host="w1\r@evil"))
    assert held is not None
    attempt = sem.try_acquire("w1", owner=owner(WAITER_ID, host="w\u202e2"), place_ttl=60)
    assert attempt.status == AttemptStatus.WAITING
    yield sem
    held.release()


def test_the_cli_shows_names_ids_and_owners_escaped(cli: Cli, hostile: Any) -> None:
    listing = cli("list")
    assert listing.exit_code == 0, listing.output
    assert_safe(listing.stdout)
    lines = listing.stdout.splitlines()
    rows = [line for line in lines if "evil" in line and " / partition" not in line]
    assert rows == [next(line for line in lines if line.startswith(SHOWN + "  "))]  # not forged
    assert f"  {SHOWN} / partition (default): used 1, cap -, weight 1, waiting 1" in lines
    assert {r["name"] for r in json.loads(cli("list", "--json").stdout)} >= {NAME}

    show = cli("show", NAME)
    assert show.exit_code == 0, show.output
    assert_safe(show.stdout)
    assert f"semaphore {NAME!r}" in show.stdout  # repr escapes the same characters
    holder = next(line for line in show.stdout.splitlines() if TASK_SHOWN in line)
    assert r"proj.\x1b[2Jtask" in holder
    assert r"w1\r@evil" in holder
    assert any(line.split()[:2] == ["0", WAITER_SHOWN] for line in show.stdout.splitlines())
    detail = json.loads(cli("show", NAME, "--json").stdout)  # JSON: the raw values
    assert [h["task_id"] for h in detail["holder_list"]] == [TASK_ID]

    for args in (("explain", WAITER_ID), ("explain", TASK_ID), ("top", "--iterations", "1")):
        result = cli(*args)
        assert result.exit_code == 0, result.output
        assert_safe(result.stdout)
        assert SHOWN in result.stdout or repr(NAME) in result.stdout
    assert f"task {WAITER_SHOWN} (ops.one) waits for semaphore" in cli("explain", WAITER_ID).stdout
    assert r"on w1\r@evil" in cli("explain", TASK_ID).stdout


def test_the_cli_actions_and_errors_show_names_escaped(cli: Cli, hostile: Any) -> None:
    changed = cli("set-limit", NAME, "2")
    assert changed.exit_code == 0, changed.output
    assert_safe(changed.stdout)
    assert f"`celery semaphore set-limit {SHOWN} --clear`" in changed.stdout
    audit = cli("audit")
    assert_safe(audit.stdout)
    assert f"set-limit {NAME!r} by " in audit.stdout

    missing = cli("release", NAME, "--task-id", "nobody\x1b[2J")
    assert missing.exit_code == 1
    assert_safe(missing.stderr)
    assert len(missing.stderr.strip().splitlines()) == 1
    assert r"task nobody\x1b[2J holds no permit" in missing.stderr
    assert f"`celery semaphore show {SHOWN}`" in missing.stderr

    released = cli("release", NAME, "--task-id", TASK_ID, "--yes")
    assert released.exit_code == 0, released.output
    assert_safe(released.stdout)
    assert f"(task {TASK_SHOWN}, 1 unit(s))" in released.stdout


def formatted(record: logging.LogRecord) -> str:
    return logging.Formatter("%(semaphore)s|%(task_id)s|%(message)s").format(record)


def test_log_lines_show_names_ids_and_tracebacks_escaped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="celery_semaphore")
    log = logs.get("wait")
    log.info(
        "task %s waits for %s (%r, position %d, %.1fs)",
        "proj.\x1b[2Jtask",
        NAME,
        NAME,
        3,
        1.25,
        semaphore=NAME,
        task_id=TASK_ID,
        extra={"host": "w1\r@evil"},
    )
    try:
        raise ValueError(f"no such semaphore: {NAME}")
    except ValueError:
        log.exception("refresh failed for %s", NAME, semaphore=NAME, task_id=None)
    waits, failed = caplog.records
    line = formatted(waits)
    assert_safe(line)
    assert "\n" not in line
    assert line == (
        f"{SHOWN}|{TASK_SHOWN}|[semaphore={SHOWN} task={TASK_SHOWN}] task "
        rf"proj.\x1b[2Jtask waits for {SHOWN} ({NAME!r}, position 3, 1.2s)"
    )
    assert waits.host == r"w1\r@evil"  # type: ignore[attr-defined]
    text = formatted(failed)
    assert_safe(text)
    assert (
        text.splitlines()[0]
        == f"{SHOWN}|None|[semaphore={SHOWN} task=-] refresh failed for {SHOWN}"
    )
    assert r"ValueError: no such semaphore: evil\x1b[2J\r" in text  # controls escaped
    assert "Traceback (most recent call last):" in text  # its lines kept


@pytest.mark.timeout(120)
def test_a_worker_logs_a_per_key_name_and_a_task_id_escaped(
    worker_app: Celery,  # noqa: F811
    bodies: Bodies,  # noqa: F811
    records: LogRecords,  # noqa: F811
) -> None:
    """A name built from a task argument (``llm:{tenant}``) and a producer's task id reach the
    worker's wait line escaped."""

    @worker_app.task(name="hostile.call", bind=True, shared=False)
    @limited("llm:{tenant}", limit=1)
    def call(self: Any, tenant: str) -> None:
        bodies.run(self.request.id)

    tenant = "acme\x1b]0;pwned\x07\r\n"
    shown = r"llm:acme\x1b]0;pwned\x07\r\n"
    with start_worker(worker_app, pool="threads", concurrency=2, perform_ping_check=False):
        first = call.apply_async(kwargs={"tenant": tenant}, task_id="first\x1b[2J")
        started, finish = bodies.events(first.id)
        assert started.wait(20), "the first task never started"
        second = call.apply_async(kwargs={"tenant": tenant}, task_id=TASK_ID)
        waits = records.wait_for(
            "the second task's wait", on("wait", logging.INFO, TASK_SHOWN, "waits")
        )
        finish.set()
        assert bodies.events(second.id)[0].wait(20), "the second task never started"
        bodies.release_all()
        first.get(timeout=20)
        second.get(timeout=20)
    line = formatted(waits)
    assert_safe(line)
    assert line.startswith(f"{shown}|{TASK_SHOWN}|[semaphore={shown} task={TASK_SHOWN}] ")
    for record in records.records:
        assert_safe(formatted(record))


@pytest.fixture
def served(app: Celery) -> Iterator[str]:
    from celery_semaphore.ops import web

    port = closed_port()
    server, _ = web.start_server(app, port=port, token="tok")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_web_api_stays_json_and_the_page_renders_text_nodes(served: str, hostile: Any) -> None:
    for path in (
        "/api/semaphores",
        "/api/semaphore?name=" + urllib.parse.quote(NAME),
        "/api/explain?task_id=" + urllib.parse.quote(WAITER_ID),
    ):
        status, headers, body = request(served + path)
        assert status == 200, body
        assert headers["Content-Type"].startswith("application/json")
        # every control and non-ASCII character is a JSON escape: no raw byte to interpret
        assert all(0x20 <= b < 0x7F for b in body), body
        json.loads(body)
    listing, detail, explained = (
        json.loads(request(served + path)[2])
        for path in (
            "/api/semaphores",
            "/api/semaphore?name=" + urllib.parse.quote(NAME),
            "/api/explain?task_id=" + urllib.parse.quote(WAITER_ID),
        )
    )
    # once parsed, the raw values: the page's links and actions use them
    assert NAME in {row["name"] for row in listing["semaphores"]}
    assert (detail["name"], [h["task_id"] for h in detail["holder_list"]]) == (NAME, [TASK_ID])
    result = explained["results"][0]
    assert (result["name"], result["task_id"]) == (NAME, WAITER_ID)
    # the explanation's text is the CLI's: escaped
    assert result["text"].startswith(f"task {WAITER_SHOWN} (ops.one) waits for semaphore")
    # the page puts that text in as text nodes: no sink that parses markup
    script = request(served + "/static/app.js")[2].decode()
    for sink in (
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "DOMParser",
        "createContextualFragment",
        "srcdoc",
        "eval(",
    ):
        assert sink not in script, sink
    assert "document.createTextNode(String(child))" in script
