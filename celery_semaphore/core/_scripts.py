"""Loads the Lua scripts from package files and registers them with a redis-py client.

Each script is ``_lib.lua`` (the shared prelude) followed by its own file.  Calls use EVALSHA
and fall back to loading the script on NOSCRIPT (after a ``SCRIPT FLUSH`` or on a fresh server),
as redis-py's ``register_script`` objects do, minus their per-call overhead.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib.resources import files
from typing import Any

from redis.exceptions import NoScriptError

OPERATIONS = (
    "acquire",
    "release",
    "refresh",
    "withdraw",
    "reclaim",
    "inspect",
    "throttle",
    "group_acquire",
    "group_release",
    "group_refresh",
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


class ScriptSet:
    """The scripts of one client: their SHA1s, loaded into Redis on first NOSCRIPT."""

    def __init__(self, client: Any) -> None:
        self._client = client
        # redis-py's Script computes the SHA1 the way the server does (the client's encoding)
        self._scripts = {op: client.register_script(source(op)) for op in OPERATIONS}
        #: the client's own str -> bytes encoding (what is encoded once is sent as is)
        self.encode: Callable[[str], bytes] = self._scripts["acquire"].get_encoder().encode
        self._shas = {op: self.encode(script.sha) for op, script in self._scripts.items()}

    def __getitem__(self, operation: str) -> Any:
        return self._scripts[operation]

    def key_args(self, keys: list[str]) -> tuple[bytes, ...]:
        """``numkeys key...`` for :meth:`run`, encoded once (redis-py would on every call)."""
        return (self.encode(str(len(keys))), *(self.encode(key) for key in keys))

    def run(self, operation: str, key_args: tuple[bytes, ...], args: list[Any], last: Any) -> Any:
        """EVALSHA ``operation`` with ``key_args`` (from :meth:`key_args`), then ``args`` and
        ``last`` as ARGV: one round trip (two more, once, when the server does not know the
        script yet)."""
        client = self._client
        try:
            return client.execute_command("EVALSHA", self._shas[operation], *key_args, *args, last)
        except NoScriptError:
            script = self._scripts[operation]
            script.sha = client.script_load(script.script)
            self._shas[operation] = self.encode(script.sha)
            return client.execute_command("EVALSHA", self._shas[operation], *key_args, *args, last)
