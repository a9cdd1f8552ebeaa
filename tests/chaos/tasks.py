"""The tasks the chaos tests run in real workers (``celery -A tests.chaos.tasks worker``).

The app and its configuration are :mod:`tests.integration.proj`'s (``CS_*`` environment
variables); ``CS_CHAOS_DIR`` names the directory of the independent counter and ledger (see
:mod:`tests.chaos.record`).  Every body runs inside ``rec.body(...)``.

``step(tag, seconds, mode)`` does what ``mode`` says:

* ``ok``: sleep ``seconds``, return ``tag``;
* ``raise``: fail with ``ValueError``;
* ``retry``: the first attempt calls ``self.retry()`` (a new execution, a new permit);
* ``soft``: sleep until the soft time limit (send it with ``soft_time_limit=``), return "soft";
* ``kill``: SIGKILL its own process (the pool reports ``WorkerLostError``);
* ``sleep`` is ``ok``, named for the tests that interrupt it (hard time limit, revoke, kills);
* ``stubborn`` is ``sleep`` in a process that ignores SIGTERM, so a hard time limit's TERM
  leaves it running until billiard's SIGKILL 0.1 s later;
* ``watch``: run for ``seconds``, calling :func:`celery_semaphore.checkpoint` every 0.05 s
  (with ``semaphore_on_lease_lost="raise"`` a lost permit ends it with ``LeaseLost``, which
  the ledger records as its outcome).

``late_step`` is the same with ``acks_late`` and ``reject_on_worker_lost``; its mode
``kill_once`` SIGKILLs its process on the first delivery only (a marker file tells them apart),
so the message is redelivered and the second delivery completes.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from celery_semaphore import checkpoint, limited
from celery_semaphore.core import clock
from tests.integration.proj import LEASE, LIMIT, app

from .record import Recorder

__all__ = ["app", "late_step", "rec", "step"]

rec = Recorder(os.environ.get("CS_CHAOS_DIR", "/tmp"), LIMIT)


def _skewed_clock() -> None:
    """A clock jump on this worker host, through the package's clock seam: the seconds in
    ``<CS_CHAOS_DIR>/clock-skew`` (re-read at most every 0.2 s) are added to
    ``celery_semaphore.core.clock.monotonic()`` in every process of the worker."""
    real = clock.monotonic
    path = rec.dir / "clock-skew"
    cache = {"at": -1.0, "skew": 0.0}

    def monotonic() -> float:
        now = real()
        if now - cache["at"] >= 0.2:
            cache["at"] = now
            try:
                cache["skew"] = float(path.read_text())
            except (OSError, ValueError):
                cache["skew"] = 0.0
        return now + cache["skew"]

    clock.monotonic = monotonic


if os.environ.get("CS_CHAOS_DIR"):
    _skewed_clock()


def _run(task: Any, tag: str, seconds: float, mode: str) -> str:
    req = task.request
    with rec.body(req.id, req.retries or 0, tag) as body:
        if mode == "raise":
            raise ValueError(f"chaos {tag}")
        if mode == "retry" and not req.retries:
            raise task.retry(countdown=0.05)
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "kill_once":
            marker = rec.dir / f"killed-{req.id}"
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                time.sleep(seconds)
                os.kill(os.getpid(), signal.SIGKILL)
        if mode == "stubborn":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if mode == "watch":
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                checkpoint()
                time.sleep(0.05)
            return tag
        if mode == "soft":
            try:
                time.sleep(max(seconds, 30.0))
            except SoftTimeLimitExceeded:
                body.outcome = "soft"
                return "soft"
        time.sleep(seconds)
    return tag


@app.task(bind=True, max_retries=3)
@limited("main", limit=LIMIT, lease_ttl=LEASE)
def step(self: Any, tag: str, seconds: float = 0.1, mode: str = "ok") -> str:
    return _run(self, tag, seconds, mode)


@app.task(bind=True, max_retries=3, acks_late=True, reject_on_worker_lost=True)
@limited("main", limit=LIMIT, lease_ttl=LEASE)
def late_step(self: Any, tag: str, seconds: float = 0.1, mode: str = "ok") -> str:
    return _run(self, tag, seconds, mode)
