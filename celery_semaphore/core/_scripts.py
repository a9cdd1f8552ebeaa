"""Loads the Lua scripts from package files and registers them with a redis-py client.

Each script is ``_lib.lua`` (the shared prelude) followed by its own file.  Calls use EVALSHA
and fall back to loading the script on NOSCRIPT (after a ``SCRIPT FLUSH`` or on a fresh server),
as redis-py's ``register_script`` objects do, minus their per-call overhead.

On a plain ``redis.Redis`` client (not a cluster client, not a single-connection client, no
client-side cache, ``execute_command`` not wrapped by an instrumentation), a call takes the
lean route: the command is packed here (the SHA1 and the keys once, as bytes) and sent on a
connection of the client's own pool, whose reply is read as redis-py would.  That spares
redis-py's per-command machinery, which costs about as much as the round trip itself on a
local Redis.  A connection error or timeout on that route is retried by the connection's own
retry policy, as redis-py retries every command (the same attempts and back-off, so a client's
bound on a hung Redis holds; the scripts are idempotent per ticket and claim, so a call that
did run is found again, not repeated).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from functools import cache
from importlib.resources import files
from typing import Any

import redis as redis_lib
from redis.exceptions import NoScriptError

_record: Callable[..., None] | None
try:  # redis-py >= 8 records command durations when OpenTelemetry is set up
    from redis.observability.recorder import record_operation_duration as _record
except ImportError:  # pragma: no cover - older redis-py: nothing to record
    _record = None
if _record is not None and not {
    "command_name",
    "duration_seconds",
    "server_address",
    "server_port",
    "db_namespace",
} <= set(inspect.signature(_record).parameters):  # pragma: no cover - another redis-py
    _record = None

OPERATIONS = (
    "acquire",
    "release",
    "refresh",
    "withdraw",
    "reclaim",
    "sweep",
    "inspect",
    "throttle",
    "group_acquire",
    "group_release",
    "group_refresh",
    "live",
)


@cache
def source(operation: str) -> str:
    """The full text of one script: the prelude, then the operation."""
    if operation not in OPERATIONS:
        raise ValueError(f"unknown script {operation!r}; known: {', '.join(OPERATIONS)}")
    pkg = files("celery_semaphore.core") / "scripts"
    prelude = (pkg / "_lib.lua").read_text(encoding="utf-8")
    body = (pkg / f"{operation}.lua").read_text(encoding="utf-8")
    return f"{prelude}\n{body}"


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%b\r\n" % (len(value), value)


def _lean_pool(client: Any) -> Any:
    """The connection pool of a client whose commands may take the lean route, else None."""
    if not isinstance(client, redis_lib.Redis) or "execute_command" in vars(client):
        return None
    method = type(client).execute_command
    if hasattr(method, "__wrapped__") or getattr(method, "__module__", "") != "redis.client":
        return None  # an instrumentation (tracing, metrics) wraps it: keep it in the loop
    if getattr(client, "connection", None) is not None:
        return None  # single_connection_client: its connection and lock are the client's
    pool = getattr(client, "connection_pool", None)
    if pool is None or getattr(pool, "cache", None) is not None:
        return None
    return pool


def _send_and_read(conn: Any, packed: bytes) -> Any:
    conn.send_packed_command((packed,))
    return conn.read_response()


def _takes_no_arguments(method: Any) -> bool:
    """Whether ``pool.get_connection()`` may be called without a command name (redis-py >=
    5.3; earlier ones require it)."""
    try:
        params = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):  # pragma: no cover - a builtin or odd callable
        return False
    first = params[0] if params else None
    return (
        first is None
        or first.default is not inspect.Parameter.empty
        or first.kind
        in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        )
    )


class ScriptSet:
    """The scripts of one client: their SHA1s, loaded into Redis on first NOSCRIPT."""

    def __init__(self, client: Any) -> None:
        self._client = client
        # redis-py's Script computes the SHA1 the way the server does (the client's encoding)
        self._scripts = {op: client.register_script(source(op)) for op in OPERATIONS}
        #: the client's own str -> bytes encoding (what is encoded once is sent as is)
        encoder = self._scripts["acquire"].get_encoder()
        self.encode: Callable[[str], bytes] = encoder.encode
        self._encoding: str = encoder.encoding
        self._errors: str = encoder.encoding_errors
        self._shas = {op: self.encode(script.sha) for op, script in self._scripts.items()}
        self._pool = _lean_pool(client)
        self._bare_get = self._pool is not None and _takes_no_arguments(self._pool.get_connection)
        #: ``$7 EVALSHA $40 <sha>`` per operation, packed
        self._heads = {op: _bulk(b"EVALSHA") + _bulk(sha) for op, sha in self._shas.items()}
        #: packed ``numkeys key...`` per key_args tuple (one per semaphore or group)
        self._packed_keys: dict[tuple[bytes, ...], bytes] = {}

    def __getitem__(self, operation: str) -> Any:
        return self._scripts[operation]

    def key_args(self, keys: list[str]) -> tuple[bytes, ...]:
        """``numkeys key...`` for :meth:`run`, encoded once (redis-py would on every call)."""
        return (self.encode(str(len(keys))), *(self.encode(key) for key in keys))

    def run(self, operation: str, key_args: tuple[bytes, ...], args: list[Any], last: Any) -> Any:
        """EVALSHA ``operation`` with ``key_args`` (from :meth:`key_args`), then ``args`` and
        ``last`` as ARGV: one round trip (two more, once, when the server does not know the
        script yet)."""
        if self._pool is not None:
            try:
                return self._lean(operation, key_args, args, last)
            except NoScriptError:
                self._load(operation)
                return self._lean(operation, key_args, args, last)
        client = self._client
        try:
            return client.execute_command("EVALSHA", self._shas[operation], *key_args, *args, last)
        except NoScriptError:
            self._load(operation)
            return client.execute_command("EVALSHA", self._shas[operation], *key_args, *args, last)

    def _load(self, operation: str) -> None:
        script = self._scripts[operation]
        script.sha = self._client.script_load(script.script)
        self._shas[operation] = sha = self.encode(script.sha)
        self._heads[operation] = _bulk(b"EVALSHA") + _bulk(sha)

    def _pack(
        self, operation: str, key_args: tuple[bytes, ...], args: list[Any], last: Any
    ) -> bytes:
        """The EVALSHA command in RESP, as redis-py would pack it (in one piece)."""
        keys = self._packed_keys.get(key_args)
        if keys is None:
            keys = self._packed_keys[key_args] = b"".join(_bulk(k) for k in key_args)
        encoding, errors = self._encoding, self._errors
        out = [b"*%d\r\n" % (3 + len(key_args) + len(args)), self._heads[operation], keys]
        for arg in args:
            kind = type(arg)
            if kind is str:
                data = arg.encode(encoding, errors)
            elif kind is int:
                data = b"%d" % arg
            elif kind is bytes:
                data = arg
            else:
                data = self.encode(arg)  # redis-py's rules (and errors) for anything else
            out.append(b"$%d\r\n%b\r\n" % (len(data), data))
        if type(last) is not bytes:
            last = self.encode(last)
        out.append(b"$%d\r\n%b\r\n" % (len(last), last))
        return b"".join(out)

    def _lean(self, operation: str, key_args: tuple[bytes, ...], args: list[Any], last: Any) -> Any:
        packed = self._pack(operation, key_args, args, last)
        pool = self._pool
        started = time.monotonic() if _record is not None else 0.0
        conn = pool.get_connection() if self._bare_get else pool.get_connection("EVALSHA")
        try:
            # the connection's own retry policy, as redis-py applies it to every command: the
            # same attempts and back-off (a client's bound on a hung Redis holds), and a
            # connection that failed is closed before the next attempt
            reply = conn.retry.call_with_retry(
                lambda: _send_and_read(conn, packed), lambda _error: conn.disconnect()
            )
        finally:
            pool.release(conn)
        if _record is not None:
            _record(
                command_name="EVALSHA",
                duration_seconds=time.monotonic() - started,
                server_address=getattr(conn, "host", None),
                server_port=getattr(conn, "port", None),
                db_namespace=str(getattr(conn, "db", "")),
            )
        return reply
