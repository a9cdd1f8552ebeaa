"""The operator's web page: every semaphore, its holders and waiters, live, in a browser.

``celery -A proj semaphore serve`` (and, with ``semaphore_metrics_port`` set, every worker's
metrics port) serves one page and the JSON it polls once a second.  The page is plain HTML and
a small script shipped in the package (``ops/web_static``): nothing is fetched from elsewhere.
Everything it shows is computed by :mod:`.views` (the same dicts as ``celery semaphore
list/show/explain --json``), and ``explain`` is the CLI's own text (:mod:`.cli_render`).
What it reads and does lives in :mod:`.web_board` (:class:`Board`, :class:`Actions`); this
module is the HTTP side: the routes (:class:`WebApp`) and the server (:func:`start_server`).

Routes (all ``GET`` unless said; JSON unless said)::

    /                          the page (HTML); /static/app.js, /static/app.css
    /api/semaphores            {"at", "prefix", "actions", "semaphores": [views.summary, ...],
                                "total": int, "next": the name after which the next page
                                starts, or null}; ?limit=N (default 100, 0: all)&after=NAME
    /api/semaphore?name=N      views.detail + "operator_actions" (404: unknown name)
    /api/explain?task_id=T     {"results": [views.explain + "text"]} (404: not found)
    /healthz                   "ok" (text)
    /metrics                   Prometheus text, when served on a worker's metrics port
    POST /api/actions/set-limit  {"name", "limit": int | null (null clears the override)}
    POST /api/actions/set-rate   {"name", "rate": "10/s" | ["60/m", "1000/h"] | null (null
                                 or "none" clears the runtime rate)}
    POST /api/actions/release    {"name", "token"} or {"name", "task_id"}
    POST /api/actions/reset      {"name"}

Actions exist only when the server was started with them allowed (``serve
--allow-actions``) and a token; each request must carry ``X-Semaphore-Token: <token>``
(compared with :func:`hmac.compare_digest`), else it is refused with 403.  Each action is
logged and appended to the audit list like the CLI's (:mod:`.audit`), with ``via: web``, the
peer address and the name the operator typed into the page.  A worker's metrics port never
allows actions.

Names are user data: the server sends them only inside JSON, and the page puts them into the
document as text (``textContent``), never as markup.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from http import HTTPStatus
from importlib import resources
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from .. import logs
from . import actions
from .web_board import PAGE, Actions, Board, HttpError

__all__ = [
    "TOKEN_ENV",
    "Actions",
    "Board",
    "WebApp",
    "start_server",
]

log = logs.get("cli")

#: the environment variable ``serve`` reads the action token from (``--token`` wins)
TOKEN_ENV = "CELERY_SEMAPHORE_WEB_TOKEN"
#: the header a request carries its token in
TOKEN_HEADER = "X-Semaphore-Token"
#: the largest request body accepted (an action is a few dozen bytes)
MAX_BODY = 16 * 1024

_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/app.css": ("app.css", "text/css; charset=utf-8"),
}
_SECURITY_HEADERS = [
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    ("Cache-Control", "no-store"),
]


def _static(name: str) -> bytes:
    return (resources.files("celery_semaphore.ops") / "web_static" / name).read_bytes()


class WebApp:
    """The WSGI application: the page, its JSON, the actions and (``metrics_app``) the
    Prometheus exporter's ``/metrics``."""

    def __init__(
        self,
        board: Board,
        actions: Actions | None = None,
        *,
        metrics_app: Callable[..., Iterable[bytes]] | None = None,
        hosts: frozenset[str] | None = None,
    ) -> None:
        self.board = board
        self.actions = actions
        self.metrics_app = metrics_app
        #: the host names a request may be addressed to (None: any).  A server on loopback
        #: answers only "localhost" and loopback addresses, so a web site that rebinds its own
        #: DNS name to 127.0.0.1 cannot read the page from the operator's browser.
        self.hosts = hosts

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO") or "/"
        method = environ.get("REQUEST_METHOD", "GET")
        if path == "/metrics" and self.metrics_app is not None:
            return self.metrics_app(environ, start_response)
        try:
            self._check_host(environ)
            status, ctype, body = self._route(method, path, environ)
        except HttpError as exc:
            status, ctype, body = exc.status, *_json({"error": str(exc)})
        except Exception as exc:  # Redis down, a bad configuration: say so, keep serving
            log.warning(
                "celery-semaphore web page: %s %s failed: %s",
                method,
                path,
                exc,
                semaphore=None,
                task_id=None,
            )
            status, ctype, body = HTTPStatus.SERVICE_UNAVAILABLE, *_json({"error": str(exc)})
        headers = [("Content-Type", ctype), ("Content-Length", str(len(body))), *_SECURITY_HEADERS]
        start_response(f"{status.value} {status.phrase}", headers)
        return [body] if method != "HEAD" else [b""]

    def _check_host(self, environ: Mapping[str, Any]) -> None:
        if self.hosts is None:
            return
        host = str(environ.get("HTTP_HOST") or "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name.strip("[]").lower() not in self.hosts:
            raise HttpError(
                HTTPStatus.MISDIRECTED_REQUEST,
                f"this page answers only on {', '.join(sorted(self.hosts))} (it listens on "
                f"loopback); the request was addressed to {host!r}",
            )

    def _route(self, method: str, path: str, environ: Mapping[str, Any]) -> tuple[Any, ...]:
        query = parse_qs(environ.get("QUERY_STRING") or "")
        if path.startswith("/api/actions/"):
            if method != "POST":
                raise HttpError(HTTPStatus.METHOD_NOT_ALLOWED, "actions are POST requests")
            return (HTTPStatus.OK, *_json(self._act(path.removeprefix("/api/actions/"), environ)))
        if method not in ("GET", "HEAD"):
            raise HttpError(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} is not accepted here")
        if path in _STATIC:
            name, ctype = _STATIC[path]
            return HTTPStatus.OK, ctype, _static(name)
        if path == "/healthz":
            return HTTPStatus.OK, "text/plain; charset=utf-8", b"ok\n"
        if path == "/api/semaphores":
            rows, total, after = self.board.overview_page(_limit(query), _after(query))
            return (
                HTTPStatus.OK,
                *_json(
                    {
                        "at": time.time(),
                        "prefix": self.board.prefix,
                        "actions": self.actions is not None,
                        "semaphores": rows,
                        "total": total,
                        "next": after,
                    }
                ),
            )
        if path == "/api/semaphore":
            name = _one(query, "name")
            data = self.board.detail(name)
            if data is None:
                raise HttpError(HTTPStatus.NOT_FOUND, f"unknown semaphore {name!r}")
            data["actions"] = self.actions is not None
            data["prefix"] = self.board.prefix
            return (HTTPStatus.OK, *_json(data))
        if path == "/api/explain":
            task_id = _one(query, "task_id")
            results = self.board.explain(task_id)
            if not results:
                raise HttpError(
                    HTTPStatus.NOT_FOUND,
                    f"task {task_id} is neither holding nor waiting for any known semaphore: "
                    "it may still be in the broker's queue, be done already, or not be a "
                    "limited task",
                )
            return (HTTPStatus.OK, *_json({"results": results}))
        raise HttpError(HTTPStatus.NOT_FOUND, f"no such page: {path}")

    def _act(self, action: str, environ: Mapping[str, Any]) -> dict[str, Any]:
        if self.actions is None:
            raise HttpError(
                HTTPStatus.FORBIDDEN,
                "actions are off: this page is read-only (start `celery semaphore serve` "
                "with --allow-actions and a token to allow them)",
            )
        if not self.actions.allowed(environ.get("HTTP_X_SEMAPHORE_TOKEN")):
            raise HttpError(HTTPStatus.FORBIDDEN, f"missing or wrong {TOKEN_HEADER} header")
        body = _body(environ)
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise HttpError(HTTPStatus.BAD_REQUEST, "'name' (a semaphore name) is required")
        operator = body.get("operator")
        who = {
            "via": "web",
            "remote": environ.get("REMOTE_ADDR"),
            "operator": operator[:100] if isinstance(operator, str) and operator else None,
        }
        if action == "set-limit":
            limit = body.get("limit")
            if limit is not None and (
                not isinstance(limit, int) or isinstance(limit, bool) or limit < 1
            ):
                raise HttpError(
                    HTTPStatus.BAD_REQUEST, f"limit={limit!r}: give an int >= 1, or null to clear"
                )
            return self.actions.set_limit(name, limit, who)
        if action == "set-rate":
            return self.actions.set_rate(name, _rates(body.get("rate")), who)
        if action == "release":
            token, task_id = body.get("token"), body.get("task_id")
            if not isinstance(token, (str, type(None))) or not isinstance(
                task_id, (str, type(None))
            ):
                raise HttpError(HTTPStatus.BAD_REQUEST, "'token' and 'task_id' are strings")
            return self.actions.release(name, token, task_id, who)
        if action == "reset":
            return self.actions.reset(name, who)
        raise HttpError(HTTPStatus.NOT_FOUND, f"no such action: {action}")


def _json(value: Any) -> tuple[str, bytes]:
    return "application/json", json.dumps(value, default=str).encode("utf-8")


def _rates(value: Any) -> Any:
    """The windows of a set-rate body's ``rate`` (None: clear), or 400 with the core's
    message (it names the parameter and the value)."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items) or not items:
        raise HttpError(
            HTTPStatus.BAD_REQUEST,
            f'rate={value!r}: give a rate such as "10/s", a list of them, or null to clear',
        )
    try:
        return actions.parse_rate(items)
    except (TypeError, ValueError) as exc:
        raise HttpError(HTTPStatus.BAD_REQUEST, str(exc)) from exc


def _one(query: Mapping[str, list[str]], key: str) -> str:
    values = query.get(key)
    if not values or not values[0]:
        raise HttpError(HTTPStatus.BAD_REQUEST, f"the query parameter {key!r} is required")
    return values[0]


def _limit(query: Mapping[str, list[str]]) -> int | None:
    """The ``limit`` of a page (default :data:`PAGE`; 0: all)."""
    values = query.get("limit")
    if not values:
        return PAGE
    try:
        limit = int(values[0])
    except ValueError:
        limit = -1
    if limit < 0:
        raise HttpError(HTTPStatus.BAD_REQUEST, "limit must be an int >= 0 (0: all)")
    return limit or None


def _after(query: Mapping[str, list[str]]) -> str | None:
    values = query.get("after")
    return values[0] if values and values[0] else None


def _body(environ: Mapping[str, Any]) -> dict[str, Any]:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = -1
    if length < 0 or length > MAX_BODY:
        raise HttpError(HTTPStatus.BAD_REQUEST, f"send a JSON body of at most {MAX_BODY} bytes")
    try:
        value = json.loads(environ["wsgi.input"].read(length) or b"{}")
    except ValueError as exc:
        raise HttpError(HTTPStatus.BAD_REQUEST, f"the body is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise HttpError(HTTPStatus.BAD_REQUEST, "the body must be a JSON object")
    return value


class _Server(ThreadingMixIn, WSGIServer):
    """A WSGI server answering each request in its own daemon thread."""

    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def start_server(
    app: Any,
    *,
    port: int,
    address: str = "127.0.0.1",
    scan: bool = True,
    token: str | None = None,
    metrics_registry: Any = None,
) -> tuple[Any, threading.Thread]:
    """Serve the page on ``address:port`` from a daemon thread; return (server, thread).

    ``token``: allow the actions, for requests that carry it.  ``metrics_registry``: also
    serve it as Prometheus ``/metrics`` (what a worker's metrics port does)."""
    board = Board(app, scan=scan)
    actions = Actions(board, token) if token is not None else None
    metrics_app = None
    if metrics_registry is not None:
        import prometheus_client

        metrics_app = prometheus_client.make_wsgi_app(metrics_registry)
    web = WebApp(board, actions, metrics_app=metrics_app, hosts=_loopback_hosts(address))
    server = make_server(address, port, web, server_class=_Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="celery-semaphore-web", daemon=True)
    thread.start()
    return server, thread


#: the names a request to a server on loopback may use
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def _loopback_hosts(address: str) -> frozenset[str] | None:
    """Who a server on ``address`` answers: only loopback names when it listens on loopback
    (see :attr:`WebApp.hosts`), anyone otherwise (it is then reached by whatever name)."""
    import ipaddress

    if address == "localhost":
        return LOOPBACK_HOSTS
    try:
        return LOOPBACK_HOSTS if ipaddress.ip_address(address).is_loopback else None
    except ValueError:  # a host name
        return None
