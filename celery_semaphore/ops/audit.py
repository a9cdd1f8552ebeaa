"""Operator actions on semaphores (forced release, reset, runtime limits and rates): who,
when, what.

Every such action of ``celery semaphore`` is logged at WARNING on ``celery_semaphore.cli`` and
appended to a capped list in Redis, so the next operator sees it (``celery semaphore audit``,
and the last few under ``celery semaphore show NAME``)::

    <prefix>:audit   LIST  newest first, at most MAX_ENTRIES JSON entries:
                           {"at": epoch seconds, "action": "release" | "reset" | "set-limit"
                            | "clear-limit" | "set-rate" | "clear-rate", "name": semaphore,
                            "user": login name, "host": hostname, "pid": int,
                            "detail": {...}}
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from typing import Any

from .. import logs

__all__ = ["MAX_ENTRIES", "audit_key", "operator", "read", "record"]

log = logs.get("cli")

MAX_ENTRIES = 1000


def audit_key(prefix: str) -> str:
    return f"{prefix}:audit"


def operator() -> dict[str, Any]:
    """Who is acting: login name, host and pid of this process."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name (e.g. a uid without a passwd entry)
        user = f"uid:{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return {"user": user, "host": socket.gethostname(), "pid": os.getpid()}


def record(client: Any, prefix: str, action: str, name: str, **detail: Any) -> dict[str, Any]:
    """Log the action at WARNING and append it to the audit list; return the entry."""
    entry = {"at": time.time(), "action": action, "name": name, **operator(), "detail": detail}
    task_id = detail.get("task_id")
    log.warning(
        "celery-semaphore: %s by %s@%s (pid %s): %s",
        action,
        entry["user"],
        entry["host"],
        entry["pid"],
        json.dumps(detail, sort_keys=True, default=str),
        semaphore=name,
        task_id=task_id if isinstance(task_id, str) else None,
        extra={"action": action, "operator": f"{entry['user']}@{entry['host']}"},
    )
    key = audit_key(prefix)
    pipe = client.pipeline(transaction=False)
    pipe.lpush(key, json.dumps(entry, sort_keys=True, default=str))
    pipe.ltrim(key, 0, MAX_ENTRIES - 1)
    pipe.execute()
    return entry


def read(
    client: Any, prefix: str, name: str | None = None, limit: int = 20
) -> list[dict[str, Any]]:
    """The newest ``limit`` entries (of semaphore ``name`` only, when given)."""
    out: list[dict[str, Any]] = []
    for raw in client.lrange(audit_key(prefix), 0, MAX_ENTRIES - 1):
        try:
            entry = json.loads(raw)
        except (TypeError, ValueError):
            continue
        if not isinstance(entry, dict) or (name is not None and entry.get("name") != name):
            continue
        out.append(entry)
        if len(out) >= limit:
            break
    return out
