"""The web page's server without a worker: routes, refusals and a Redis that is down.

The page itself, the actions and a live worker are in test_web.py."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_semaphore import Semaphore
from celery_semaphore.ops import web

from .conftest import make_app
from .test_cli import closed_port


def request(
    url: str,
    *,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.fixture
def served(app: Celery) -> Iterator[str]:
    port = closed_port()
    server, _ = web.start_server(app, port=port, token="tok")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_page_and_its_files_are_served_with_a_strict_policy(served: str) -> None:
    status, headers, body = request(served + "/")
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert b'<script src="/static/app.js" defer></script>' in body
    for path, kind in (("/static/app.js", "text/javascript"), ("/static/app.css", "text/css")):
        status, headers, body = request(served + path)
        assert status == 200
        assert headers["Content-Type"].startswith(kind)
        assert body
    # the script puts names into the page as text only
    script = request(served + "/static/app.js")[2].decode()
    assert "innerHTML" not in script
    assert "insertAdjacentHTML" not in script
    assert request(served + "/healthz")[2] == b"ok\n"
    status, _, body = request(served + "/", method="HEAD")
    assert (status, body) == (200, b"")


def test_json_of_a_semaphore_with_a_holder(served: str, redis_url: str, key_prefix: str) -> None:
    sem = Semaphore("alpha", 3, redis=redis_url, key_prefix=key_prefix)
    permit = sem.acquire(owner={"task_id": "t-1", "task": "ops.one", "host": "n1"})
    assert permit is not None
    try:
        listing = json.loads(request(served + "/api/semaphores")[2])
        rows = {r["name"]: r for r in listing["semaphores"]}
        assert (rows["alpha"]["used"], rows["beta"]["limit"]) == (1, 4)
        detail = json.loads(request(served + "/api/semaphore?name=alpha")[2])
        assert [h["task_id"] for h in detail["holder_list"]] == ["t-1"]
        explained = json.loads(request(served + "/api/explain?task_id=t-1")[2])
        assert explained["results"][0]["state"] == "holding"
        assert explained["results"][0]["text"].startswith("task t-1 (ops.one) holds")
    finally:
        permit.release()


@pytest.mark.parametrize(
    ("method", "path", "status", "error"),
    [
        ("GET", "/nope", 404, "no such page: /nope"),
        ("GET", "/api/semaphore", 400, "the query parameter 'name' is required"),
        ("GET", "/api/semaphore?name=nope", 404, "unknown semaphore 'nope'"),
        ("GET", "/api/explain?task_id=", 400, "the query parameter 'task_id' is required"),
        ("POST", "/api/semaphores", 405, "POST is not accepted here"),
        ("GET", "/api/actions/reset", 405, "actions are POST requests"),
    ],
)
def test_bad_requests_are_refused_with_a_reason(
    served: str, method: str, path: str, status: int, error: str
) -> None:
    got, headers, body = request(
        served + path, method=method, body=b"{}" if method == "POST" else None
    )
    assert got == status
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"error": error}


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"[1]", "the body must be a JSON object"),
        (b"{", "the body is not JSON"),
        (b"{}", "'name' (a semaphore name) is required"),
        (b'{"name": "alpha", "limit": "3"}', "limit='3': give an int >= 1, or null to clear"),
        (b'{"name": "alpha", "limit": true}', "limit=True: give an int >= 1, or null to clear"),
        (b"x" * (web.MAX_BODY + 1), "send a JSON body of at most 16384 bytes"),
    ],
)
def test_bad_action_bodies_are_refused(served: str, body: bytes, error: str) -> None:
    status, _, raw = request(
        served + "/api/actions/set-limit",
        method="POST",
        body=body,
        headers={"X-Semaphore-Token": "tok"},
    )
    assert status == 400
    assert json.loads(raw)["error"].startswith(error)


def test_release_takes_a_token_or_a_task_id(served: str) -> None:
    for body in ({"name": "alpha"}, {"name": "alpha", "token": "a", "task_id": "b"}):
        status, _, raw = request(
            served + "/api/actions/release",
            method="POST",
            body=json.dumps(body).encode(),
            headers={"X-Semaphore-Token": "tok"},
        )
        assert status == 400
        assert json.loads(raw)["error"] == "release: give either 'token' or 'task_id', not both"


def test_an_empty_token_is_refused() -> None:
    app = make_app("redis://127.0.0.1:1/0", "unused")
    with pytest.raises(ValueError, match="the web page's actions need a non-empty token"):
        web.Actions(web.Board(app), "")
    app.close()


def test_redis_down_is_a_503_and_a_warning(caplog: Any) -> None:
    app = make_app(f"redis://127.0.0.1:{closed_port()}/0", "unused")
    port = closed_port()
    server, _ = web.start_server(app, port=port, scan=False)
    try:
        with caplog.at_level(logging.WARNING, logger="celery_semaphore.cli"):
            status, _, body = request(f"http://127.0.0.1:{port}/api/semaphores")
        assert status == 503
        assert "Connection refused" in json.loads(body)["error"]
        assert any(
            r.getMessage().startswith("celery-semaphore web page: GET /api/semaphores failed: ")
            for r in caplog.records
        )
        # the page itself is still served
        assert request(f"http://127.0.0.1:{port}/")[0] == 200
    finally:
        server.shutdown()
        server.server_close()
        app.close()


@pytest.mark.parametrize("host", ["evil.example:5580", "10.0.0.5:5580", "127.0.0.1.nip.io"])
def test_a_server_on_loopback_refuses_other_host_names(served: str, host: str) -> None:
    """DNS rebinding: a site whose name now resolves to 127.0.0.1 must not read the page."""
    for path in ("/", "/api/semaphores"):
        status, _, body = request(served + path, headers={"Host": host})
        assert status == 421, body
        assert f"the request was addressed to {host!r}" in json.loads(body)["error"]
    port = served.rsplit(":", 1)[1]
    for ok in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}"):
        assert request(served + "/api/semaphores", headers={"Host": ok})[0] == 200, ok


def test_a_server_on_every_interface_answers_any_host_name() -> None:
    assert web._loopback_hosts("0.0.0.0") is None
    assert web._loopback_hosts("127.0.0.2") == web.LOOPBACK_HOSTS
    assert web._loopback_hosts("localhost") == web.LOOPBACK_HOSTS
