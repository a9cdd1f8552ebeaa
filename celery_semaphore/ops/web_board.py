"""What the operator's web page reads and does: :class:`Board` (every semaphore, its holders
and waiters, read from Redis at each request) and :class:`Actions` (set-limit, set-rate,
release and reset, behind a token).  :mod:`.web` serves them over HTTP and re-exports both."""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from . import actions, audit, cli_render, registry, views

__all__ = ["Actions", "Board", "HttpError"]

#: seconds the list of known semaphores is reused before it is read again
KNOWN_TTL = 10.0
#: the least seconds between two reads of that list for a name not found in it
FRESH_MIN = 2.0
#: how many semaphores the overview shows at a time by default
PAGE = 100


class HttpError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class Board:
    """What the page shows, read from Redis at each request (on the server's clock).

    :param app: the Celery app (its Redis, key prefix, limited tasks and settings).
    :param scan: also SCAN Redis for semaphores nobody registered (every ``KNOWN_TTL``).
    :param client: a Redis client to use (default: one made from the app's settings).
    """

    def __init__(self, app: Any, *, scan: bool = True, client: Any = None) -> None:
        from ..core.keys import validate_prefix
        from ..integration.config import redis_settings

        self.app = app
        self.scan = scan
        self.prefix = validate_prefix(app.conf.get("semaphore_key_prefix", "celery_semaphore"))
        self.hash_tag = app.conf.get("semaphore_hash_tag", None)
        if client is None:
            from ..core.connection import redis_client

            settings = redis_settings(app.conf)
            client = redis_client(  # connects at its first command
                settings.url,
                cluster=settings.cluster,
                options=settings.options,
                socket_connect_timeout=3,
                socket_timeout=5,
                retries=1,
            )
        #: the Redis client (thread-safe: each request thread takes a pooled connection)
        self.client = client
        self._lock = threading.Lock()
        self._known: dict[str, registry.Known] = {}
        self._known_at = -KNOWN_TTL
        self._semaphores: dict[tuple[str, int | None], Any] = {}

    def known(self, *, fresh: bool = False) -> dict[str, registry.Known]:
        client = self.client
        with self._lock:
            now = time.monotonic()
            age = now - self._known_at
            # `fresh` (a name not in the list): read again, but at most every FRESH_MIN
            # seconds, so a page polling an unknown name does not SCAN Redis every second
            if age >= KNOWN_TTL or (fresh and age >= FRESH_MIN):
                self._known = registry.known(client, self.prefix, self.app, scan=self.scan)
                self._known_at = now
            return dict(self._known)

    def entry(self, name: str) -> registry.Known | None:
        """The Known entry for ``name`` (as ``celery semaphore show`` finds it), or None."""
        from ..core.keys import SemaphoreKeys

        entry = self.known().get(name) or self.known(fresh=True).get(name)
        if entry is None and self.client.exists(SemaphoreKeys.for_name(name, self.prefix).state):
            entry = registry.Known(name, found_in={"redis"})
        return entry

    def semaphore(self, entry: registry.Known) -> Any:
        key = (entry.name, entry.configured_limit)
        client = self.client
        with self._lock:
            sem = self._semaphores.get(key)
            if sem is None:
                # its releases and resets wake held and parked tasks, as the CLI's do
                sem = actions.operable(self.app, client, self.prefix, entry, self.hash_tag)
                self._semaphores[key] = sem
            return sem

    # -- what the routes return ----------------------------------------------------------

    def overview(self) -> list[dict[str, Any]]:
        """``celery semaphore list --json --limit 0``: every semaphore."""
        return [views.summary(e, self.semaphore(e).inspect()) for e in self.known().values()]

    def overview_page(
        self, limit: int | None = PAGE, after: str | None = None
    ) -> tuple[list[dict[str, Any]], int, str | None]:
        """A page of :meth:`overview`: at most ``limit`` semaphores by name, from the first
        after ``after``; with how many are known, and the name the next page starts after
        (None: the last page)."""
        known = self.known()
        entries, more = registry.page(known, limit, after)
        rows = [views.summary(e, self.semaphore(e).inspect()) for e in entries]
        return rows, len(known), entries[-1].name if more else None

    def detail(self, name: str) -> dict[str, Any] | None:
        """``celery semaphore show NAME --json``; None for an unknown name."""
        entry = self.entry(name)
        if entry is None:
            return None
        data = views.detail(entry, self.semaphore(entry).inspect())
        data["operator_actions"] = audit.read(self.client, self.prefix, name, limit=5)
        data["line_policies"] = views.line_policies(self.app, data["tasks"])
        return data

    def explain(self, task_id: str) -> list[dict[str, Any]]:
        """``celery semaphore explain TASK_ID --json``, each with the CLI's text."""
        found = []
        for entry in self.known().values():
            result = views.explain(entry, self.semaphore(entry).inspect(), task_id)
            if result is not None:
                found.append({**result, "text": cli_render.explanation(result)})
        return found


class Actions:
    """set-limit, set-rate, release and reset from the page, behind a token; each logged like the
    CLI's (see :mod:`.audit`)."""

    def __init__(self, board: Board, token: str) -> None:
        if not token:
            raise ValueError("the web page's actions need a non-empty token")
        self.board = board
        self._token = token.encode("utf-8")

    def allowed(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(
            presented.encode("utf-8", "surrogateescape"), self._token
        )

    def _entry(self, name: str) -> Any:
        entry = self.board.entry(name)
        if entry is None:
            raise HttpError(HTTPStatus.NOT_FOUND, f"unknown semaphore {name!r}")
        return entry

    def set_limit(self, name: str, limit: int | None, who: Mapping[str, Any]) -> dict[str, Any]:
        """Set (or, with None, clear) the runtime override, as ``celery semaphore set-limit``."""
        entry = self._entry(name)
        sem = self.board.semaphore(entry)
        client, prefix = self.board.client, self.board.prefix
        before, after = actions.set_limit(client, prefix, sem, entry, limit, **who)
        return {"name": name, "before": before, "after": after}

    def set_rate(self, name: str, rates: Any, who: Mapping[str, Any]) -> dict[str, Any]:
        """Set (or, with None, clear) the runtime rate, as ``celery semaphore set-limit NAME
        --rate``; ``rates``: the windows parsed by :func:`.actions.parse_rate`."""
        entry = self._entry(name)
        sem = self.board.semaphore(entry)
        client, prefix = self.board.client, self.board.prefix
        before, after = actions.set_rate(client, prefix, sem, rates, **who)
        return {"name": name, "before": before, "after": after}

    def release(
        self, name: str, token: str | None, task_id: str | None, who: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Force-release permits by token or task id, as ``celery semaphore release --yes``."""
        if (token is None) == (task_id is None):
            raise HttpError(
                HTTPStatus.BAD_REQUEST, "release: give either 'token' or 'task_id', not both"
            )
        entry = self._entry(name)
        sem = self.board.semaphore(entry)
        snap = sem.inspect()
        if token is not None:
            targets = [h for h in snap.holders if h.token == token]
        else:
            targets, _ = views.find_task(snap, str(task_id))
        if not targets:
            raise HttpError(
                HTTPStatus.NOT_FOUND,
                f"no holder of semaphore {name!r} has "
                + (f"token {token}" if token is not None else f"task id {task_id}"),
            )
        client, prefix = self.board.client, self.board.prefix
        released = actions.force_release(client, prefix, sem, snap, targets, **who)
        done = [{"token": h.token, "released": r} for h, r in zip(targets, released, strict=True)]
        return {"name": name, "released": done}

    def reset(self, name: str, who: Mapping[str, Any]) -> dict[str, Any]:
        """Drop every holder and waiter, as ``celery semaphore reset --yes``."""
        entry = self._entry(name)
        sem = self.board.semaphore(entry)
        result = actions.reset(self.board.client, self.board.prefix, sem, **who)
        released, withdrawn = result.released, result.withdrawn
        return {"name": name, "holders": released, "waiters": withdrawn}
