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
import time
import weakref
from typing import Any

from .. import logs
from ._scripts import ScriptSet

__all__ = ["adopt", "ident", "keep", "procs_key", "register", "stop"]

log = logs.get("semaphore")

#: a refresh that keeps failing is logged at WARNING once, then at most this often
WARN_EVERY = 60.0

#: this process's ident and whether this process refreshes its records itself
_ident: str | None = None
_adopted = False
_lock = threading.Lock()


class _Record:
    """One record this process refreshes: a procs key on one Redis client.  It lives while
    some object that registered it (a semaphore's scripts) lives: a process that made many
    clients keeps refreshing only the records still in use."""

    def __init__(self, key_args: tuple[bytes, ...], ttl_ms: int) -> None:
        self.key_args, self.ttl_ms = key_args, ttl_ms
        self.users: weakref.WeakSet[ScriptSet] = weakref.WeakSet()
        #: monotonic time of the first failure in a row (None: the last refresh worked), and
        #: of the last WARNING about it
        self.failing_since: float | None = None
        self.warned_at = 0.0

    def scripts(self) -> ScriptSet | None:
        """One living user's scripts (None: nothing uses the record any more)."""
        return next(iter(self.users), None)


#: (id(client), procs key) -> its record
_records: dict[tuple[int, str], _Record] = {}
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
    and keep it refreshed every ``ttl / 3`` seconds while ``scripts`` (or another user's,
    registered for the same client and key) lives: the caller keeps a reference to it."""
    global _thread
    if _adopted:
        return
    ttl_ms = max(1, int(ttl * 1000))
    slot = (id(client), key)
    with _lock:
        record = _records.get(slot)
        known = record is not None and record.scripts() is not None
        if record is None or record.ttl_ms < ttl_ms:
            # the longest TTL asked for wins (its users' records must not expire early)
            users = record.users if record is not None else ()
            record = _records[slot] = _Record(scripts.key_args([key]), ttl_ms)
            record.users.update(users)
        record.users.add(scripts)
        if _thread is None or not _thread.is_alive():
            _stop.clear()
            _thread = threading.Thread(target=_loop, name="semaphore-liveness", daemon=True)
            _thread.start()
    if not known:
        _refresh(record)


def keep(client: Any, key_prefix: str, ttl: float) -> object:
    """Write this process's record for ``key_prefix`` on ``client`` and keep it refreshed
    while the returned handle lives (a worker keeps its family's for its life)."""
    scripts = ScriptSet(client)
    register(scripts, client, procs_key(key_prefix), ttl)
    return scripts


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


def _refresh(record: _Record) -> None:
    scripts = record.scripts()
    if scripts is None:
        return
    try:
        scripts.run("live", record.key_args, [ident(), record.ttl_ms], b"0")
    except Exception as exc:  # a failed refresh is tried again at the next interval
        _failed(record, exc)
        return
    if record.failing_since is not None:
        log.info(
            "liveness record refreshed again after %.0fs of failures",
            time.monotonic() - record.failing_since,
            semaphore=None,
            task_id=None,
        )
        record.failing_since = None


def _failed(record: _Record, exc: Exception) -> None:
    """Log a failed refresh: the first of a row, then at most every :data:`WARN_EVERY` s."""
    now = time.monotonic()
    if record.failing_since is None:
        record.failing_since = now
    elif now - record.warned_at < WARN_EVERY:
        return
    record.warned_at = now
    log.warning(
        "liveness record refresh failed (for %.0fs now; said again at most every %.0fs "
        "while it fails): %s: %s",
        now - record.failing_since,
        WARN_EVERY,
        type(exc).__name__,
        exc,
        semaphore=None,
        task_id=None,
    )


def _in_use() -> list[_Record]:
    """The records still in use; those nothing uses any more are forgotten (they expire)."""
    with _lock:
        for slot in [s for s, r in _records.items() if r.scripts() is None]:
            del _records[slot]
        return list(_records.values())


def _loop() -> None:
    while True:
        records = _in_use()
        interval = min((r.ttl_ms for r in records), default=3000) / 3000
        if _stop.wait(interval):
            return
        for record in records:
            _refresh(record)


def _forked() -> None:
    """In a forked child: a new ident, no records, no thread (until it acquires)."""
    global _ident, _adopted, _thread, _lock
    _ident, _adopted, _thread = None, False, None
    _lock = threading.Lock()
    _records.clear()
    _stop.clear()


os.register_at_fork(after_in_child=_forked)
