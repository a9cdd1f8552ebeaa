"""Loads the Lua scripts from package files and registers them with a redis-py client.

Each script is ``_lib.lua`` (the shared prelude) followed by its own file.  Registration goes
through ``register_script``, so calls use EVALSHA and fall back to loading the script on NOSCRIPT
(after a ``SCRIPT FLUSH`` or on a fresh server).
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Any

OPERATIONS = ("acquire", "release", "refresh", "withdraw", "reclaim", "inspect")


@cache
def source(operation: str) -> str:
    """The full text of one script: the prelude, then the operation."""
    if operation not in OPERATIONS:
        raise ValueError(f"unknown script {operation!r}; known: {', '.join(OPERATIONS)}")
    pkg = files("celery_semaphore") / "scripts"
    prelude = (pkg / "_lib.lua").read_text(encoding="utf-8")
    body = (pkg / f"{operation}.lua").read_text(encoding="utf-8")
    return f"{prelude}\n{body}"


class ScriptSet:
    """The registered scripts of one client (redis-py ``Script`` objects)."""

    def __init__(self, client: Any) -> None:
        self._scripts = {op: client.register_script(source(op)) for op in OPERATIONS}

    def __getitem__(self, operation: str) -> Any:
        return self._scripts[operation]
