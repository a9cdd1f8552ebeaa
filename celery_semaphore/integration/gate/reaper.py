"""The reaper thread (prefork, Linux): a look every :data:`.timing.REAP_EVERY` at the pool
children running the bodies the gate sent to the pool with its claim (a grant to run, or a
standby that may have been granted in its slot), and a release for one whose child died.

Celery learns of a lost child in the hub thread, and tells the gate there (see
:mod:`.dispatch`), sometimes seconds later when the hub is busy.  This look is the gate's own,
on a thread of its own: no other work of the gate (first attempts, making held tasks ready,
Redis calls for them) comes between two looks."""

from __future__ import annotations

import os
import threading

from ... import logs
from ...core import clock
from .. import children
from . import giveback, reqs, timing
from .registry import Registry

log = logs.get("gate")


class Reaper:
    """Runs the reaper thread (see the module's docstring)."""

    def __init__(self, registry: Registry, stop: threading.Event) -> None:
        self.registry = registry
        self._stop = stop
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(
            target=self._run, name="celery-semaphore-gate-reaper", daemon=True
        )
        self.thread.start()

    def _run(self) -> None:
        watching = self.registry.watching
        while not self._stop.is_set():
            if not self.registry.watched():
                # nothing in the pool to watch: wait for the next (or for the gate to stop)
                watching.wait(timing.TICK)
                watching.clear()
                continue
            if self._stop.wait(timing.REAP_EVERY):
                return
            try:
                self.look()
            except Exception as exc:  # never let it die: permits depend on it
                log.warning(
                    "gate: looking at pool children failed: %s: %s; carrying on",
                    type(exc).__name__,
                    exc,
                    semaphore=None,
                    task_id=None,
                )

    def look(self) -> None:
        """Release the permit of a body whose pool child died under it (SIGKILL, OOM) once
        the child is gone, by ticket and under the delivery's claim.  A child seen gone is
        given :data:`.timing.DEAD_GRACE` for its last result to reach the consumer (a child
        that exits after finishing, e.g. ``max_tasks_per_child``, released its permit
        itself)."""
        me = os.getpid()
        now = clock.monotonic()
        for entry in self.registry.watched():
            req = entry.req
            if not reqs.in_pool(req):
                self.registry.unwatch(entry)  # done (or Celery's own failure path ran)
                continue
            pid = getattr(req, "worker_pid", None)
            if not pid or pid == me:
                continue
            if children.alive(pid):
                entry.dead_since = 0.0
                continue
            if not entry.dead_since:
                entry.dead_since = now
                continue
            if now - entry.dead_since < timing.DEAD_GRACE:
                continue
            self.registry.unwatch(entry)
            self.registry.forget_pending(entry)
            # no tombstone: a redelivery (reject_on_worker_lost) must run, not drop
            giveback.release(entry, "the process running it died", tombstone_ttl=0, timed=True)
