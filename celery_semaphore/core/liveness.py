"""One liveness record per process: a dead process's permits come back in seconds.

Every process that acquires with a liveness TTL (``Semaphore(..., liveness_ttl=3.0)``) has one
*ident* and one record in Redis: a member of the key prefix's ``<prefix>:procs`` ZSET, scored
by its expiry on the server's clock.  One thread per process refreshes it every third of the
TTL -- one round trip per interval, however many permits and names the process holds.  Each
grant is recorded under its process's ident, and a script that runs for a name anyway
(acquire, release, refresh, reclaim, sweep) treats a holder whose process's record has expired
as free, in the same atomic step (``scripts/_lib.lua``).

A process may instead *adopt* another's ident (:func:`adopt`): a Celery pool child uses its
worker's, which its worker refreshes (the child dies with its worker; a child that dies alone
is reclaimed by its worker at once).  Off on a Redis Cluster: the records' one key cannot
share a script with a semaphore's keys, so there the lease alone brings permits back.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from typing import Any

from .. import logs
from ._scripts import ScriptSet

__all__ = ["adopt", "ident", "procs_key", "register", "stop"]

log = logs.get("semaphore")

#: this process's ident and whether this process refreshes its records itself
_ident: str | None = None
_adopted = False
_lock = threading.Lock()
#: (id(client), procs key) -> [scripts, key_args, ttl ms]
_records: dict[tuple[int, str], list[Any]] = {}
_thread: threading.Thread | None = None
_stop = threading.Event()


def procs_key(key_prefix: str) -> str:
    """The key of the liveness records of ``key_prefix`` (one per prefix)."""
    return f"{key_prefix}:procs"


def ident() -> str:
    """This process's liveness ident (made on first use; a forked child makes its own)."""
    global _ident
    if _ident is None:
        with _lock:
            if _ident is None:
                _ident = f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"
    return _ident


def adopt(other: str) -> None:
    """Use ``other``'s ident in this process, refreshed by its owner, not here (a Celery pool
    child uses its worker's: it dies with it)."""
    global _ident, _adopted
    with _lock:
        _ident, _adopted = other, True
        _records.clear()


def register(scripts: ScriptSet, client: Any, key: str, ttl: float) -> None:
    """Write this process's record under ``key`` now (unless another process refreshes it)
    and keep it refreshed every ``ttl / 3`` seconds from then on."""
    global _thread
    if _adopted:
        return
    ttl_ms = max(1, int(ttl * 1000))
    slot = (id(client), key)
    with _lock:
        entry = _records.get(slot)
        if entry is not None and entry[2] >= ttl_ms:
            return
        entry = _records[slot] = [scripts, scripts.key_args([key]), ttl_ms]
        if _thread is None or not _thread.is_alive():
            _stop.clear()
            _thread = threading.Thread(target=_loop, name="semaphore-liveness", daemon=True)
            _thread.start()
    _refresh(entry)


def stop() -> None:
    """Stop refreshing (the records then expire: for tests, and a process that is done)."""
    global _thread
    _stop.set()
    thread = _thread
    if thread is not None and thread is not threading.current_thread():
        thread.join(5.0)
    with _lock:
        _records.clear()
        _thread = None


def _refresh(entry: list[Any]) -> None:
    scripts, key_args, ttl_ms = entry
    try:
        scripts.run("live", key_args, [ident(), ttl_ms], b"0")
    except Exception as exc:  # a failed refresh is tried again at the next interval
        log.warning(
            "liveness record refresh failed: %s: %s",
            type(exc).__name__,
            exc,
            semaphore=None,
            task_id=None,
        )


def _loop() -> None:
    while True:
        with _lock:
            entries = list(_records.values())
        interval = min((e[2] for e in entries), default=3000) / 3000
        if _stop.wait(interval):
            return
        for entry in entries:
            _refresh(entry)


def _forked() -> None:
    """In a forked child: a new ident, no records, no thread (until it acquires)."""
    global _ident, _adopted, _thread, _lock
    _ident, _adopted, _thread = None, False, None
    _lock = threading.Lock()
    _records.clear()
    _stop.clear()


os.register_at_fork(after_in_child=_forked)
