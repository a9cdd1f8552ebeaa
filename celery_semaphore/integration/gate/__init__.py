"""The worker-side gate: a limited task waits for its permit in the consumer, not in a pool slot.

Celery hands every task the worker receives to ``Consumer.on_task_request``, which sends it to
the pool.  The gate, put there by a consumer bootstep (:mod:`.consumer`) when the app has limited
tasks and ``semaphore_worker_hold`` is above 0, wraps that call for limited tasks:

* the task is tried at once, in one script, by the gate's arrivals thread (so the consumer
  goes on taking messages, unlimited ones included, without waiting for Redis): if granted,
  it goes to the pool with its grant in the request (``semaphore_gate``), and the body starts
  without another round trip;
* otherwise the request is **held** in the consumer: unacknowledged, like an ETA task, and off
  the pool, so the slot stays free for other work; the consumer's prefetch window grows by one
  for each held task, so other messages keep flowing.  Its place in the semaphore's FIFO line
  names this node's wake list; the release that frees units for it grants them to it and
  pushes the grant there (or wakes it, for a group; in this very process it calls the gate
  directly: see :mod:`.wakes`), and the gate hands the request to the pool with that grant.

A timeline of a task that waits, then runs (``T`` arrives while the limit is taken)::

    consumer   T received ──► held (no slot) ──► arrivals thread: try_acquire("T-id:0")
                                                  → WAITING, position 2
    any worker a holder's body ends ──► release grants T the unit (a handoff, under T's
               claim) ──► RPUSH "h <fence> <expiry> <claim> T" onto the node's wake list
    gate thread BLMPOP returns it ──► the claim is T's ──► hub.call_soon(dispatch T)
    consumer   T goes to the pool with its grant ──► the body runs, releases in ``finally``

The gate's thread also keeps held places alive, repairs lost wake-ups, refreshes the leases of
grants the pool has not started yet, drops held tasks that get revoked, fails those past
``semaphore_max_wait`` with ``SemaphoreTimeout``, and hands those held too long (longer than
:data:`MAX_HOLD`, or half the Redis broker's ``visibility_timeout``) to the pool to park, so the
broker never redelivers a message the gate still holds.

When the gate is not installed (``semaphore_worker_hold = 0``, or a broker transport without an
event loop on a non-green pool), the task body's wrapper acquires by itself (see
:mod:`celery_semaphore.integration.body`).

The package, by responsibility:

* :mod:`.registry`: the deliveries held or held before, indexed by stage, under one lock;
  every change of a delivery's stage goes through it;
* :mod:`.hook`: ``on_task_request`` (hub thread): a limited request becomes an entry
  (:mod:`.entry`) and is held;
* :mod:`.attempts`: a held task's tries for its permit, and the handoffs and wake-ups a
  release sends it;
* :mod:`.ready`: held tasks made ready (or not) as pool slots come and go;
* :mod:`.forwarding`: held tasks sent ahead to stand by, and what the gate forwards to them;
* :mod:`.dispatch`: the hand-over to the pool, with the gate's directive, and the watch on it
  there; :mod:`.giveback`: grants, places and permits given back;
* the threads: :mod:`.arrivals` (first attempts, readiness), :mod:`.gate_thread` (wake-ups,
  retries due, and the tick's maintenance, :mod:`.upkeep`) and, on prefork, :mod:`.reaper`
  (dead pool children);
* :mod:`.timing`, :mod:`.health` (Redis answering), :mod:`.waitlog`, :mod:`.reqs` (what the
  gate asks of a Celery request).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from ...core.semaphore import HANDOFF_MARK
from .. import children, config, wakes
from ..delivery import gate_nonce
from ..standby import Standing, per_semaphore
from . import giveback, reqs
from .arrivals import Arrivals, ArrivalsThread
from .attempts import Attempts
from .dispatch import ToPool
from .forwarding import Ahead
from .gate_thread import GateThread
from .health import Health
from .hook import Hook
from .ready import Readying
from .reaper import Reaper
from .registry import Registry
from .timing import MAX_HOLD
from .upkeep import Upkeep
from .waitlog import WaitLog

__all__ = ["MAX_HOLD", "Gate"]


class Gate:
    """Holds the limited requests of one consumer that are waiting for a permit: the parts
    above, put together, behind the surface the consumer step, the wake router and the
    inspection commands use."""

    def __init__(self, consumer: Any, dispatch: Callable[[Any], Any], hold: int) -> None:
        self.consumer = consumer
        self.app = consumer.app
        self.hold = hold
        self.pid = os.getpid()
        self.nonce = gate_nonce()
        self.key = wakes.gate_key(
            self.app.conf.get("semaphore_key_prefix", "celery_semaphore"),
            consumer.hostname,
            self.nonce,
        )
        #: the wake list of held tasks that take handoffs (single semaphores)
        self.handoff_key = self.key + HANDOFF_MARK
        self._stop = threading.Event()
        self.health = Health()
        #: Redis failing for the gate thread: logged when it starts and, counted, when it ends
        self.outage = self.health.outage
        self.arrivals = Arrivals()
        standby = config.setting(self.app.conf, "semaphore_worker_standby", None)
        standing = Standing(per_semaphore(standby, getattr(consumer, "pool", None)))
        self.registry = Registry(consumer, hold, standing, self.arrivals.notify)
        self.to_pool = ToPool(consumer, dispatch, self.registry, self.health, self.key, self.nonce)
        self.attempts = Attempts(Ahead(self.app, self.to_pool, self._stop), WaitLog(), self._stop)
        readying = Readying(self.attempts, self._stop)
        self.upkeep = Upkeep(self.app, readying)
        #: look for dead pool children running gated bodies (prefork)
        self.arrivals_thread = ArrivalsThread(self.arrivals, readying, self._stop)
        #: looks for dead pool children running the bodies it sent (prefork, Linux)
        self.reaper: Reaper | None = None
        if children.alive(os.getpid()) and not reqs.submit_anywhere(consumer):
            self.registry.watch_children()
            self.reaper = Reaper(self.registry, self._stop)
        self.gate_thread = GateThread(self.app, self.key, self.handoff_key, self.upkeep, self._stop)
        self.hook = Hook(self.app, self.to_pool, self.arrivals, self.handoff_key)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        wakes.register(self.key, self)
        wakes.register(self.handoff_key, self)
        self.gate_thread.start()
        self.arrivals_thread.start()
        if self.reaper is not None:
            self.reaper.start()

    def stop(self) -> None:
        """Stop holding: the held messages were never acknowledged, so the broker delivers
        them again (to this worker after a reconnect, or to another); their places go.
        Grants already handed to the pool are left alone (their bodies may be starting, and
        release them themselves); one the pool never starts goes back once the pool has stopped
        (:meth:`after_pool_stopped`).  A
        grant made but not yet handed to the pool (a release woke the gate as the worker
        stopped: the hub no longer runs the hand-over) is given back now, not left to its
        lease, and is never handed over later.  So is a grant a release handed off to a held
        task as it stopped, and the places of tasks that left the gate for the pool (to park)
        but never reached it go too."""
        self._stop.set()
        wakes.unregister(self.key)
        wakes.unregister(self.handoff_key)
        self.arrivals.notify_all()
        self.registry.watching.set()
        self.gate_thread.interrupt()
        for runner in (self.gate_thread, self.arrivals_thread, self.reaper):
            if runner is not None and runner.thread is not None:
                runner.thread.join(timeout=5)
                runner.thread = None
        self.arrivals.clear()  # still held: withdrawn below, redelivered by the broker
        giveback.at_stop(*self.registry.stop_all())

    def after_pool_stopped(self, pool: Any) -> None:
        """The pool has stopped (after :meth:`stop`): no job it was given starts any more.
        A grant handed to it whose job never started (the pool drops the jobs it has not
        started at stop) is given back now, not left to its lease; so is a grant a release
        made to a standby that never started before its place was withdrawn.  Nothing is
        done while the pool may still start a job."""
        if getattr(pool, "_state", None) != getattr(pool, "TERMINATE", None):
            return
        never, standing = self.registry.never_started()
        for entry in never:
            # no tombstone: the message was never acknowledged, and its redelivery must run
            giveback.release(entry, "the worker stopped before it started", tombstone_ttl=0)
        for entry in standing:
            giveback.give_back_handoff(entry)  # under its claim: nothing when none was made

    # -- what the consumer and releases call -------------------------------------------------

    def on_task_request(self, req: Any) -> Any:
        """Replaces ``Consumer.on_task_request``: limited tasks pass through the gate (see
        :mod:`.hook`)."""
        return self.hook.on_task_request(req)

    def wake(self, ticket: str) -> None:
        """Units were freed for ``ticket`` (see :meth:`.attempts.Attempts.wake`)."""
        self.attempts.wake(ticket)

    def handed(self, ticket: str, fence: int, expires_at: float, claim: str) -> None:
        """A release granted ``ticket`` its units by handoff, under ``claim`` (see
        :meth:`.attempts.Attempts.handed`)."""
        self.attempts.handed(ticket, fence, expires_at, claim)

    # -- inspection ---------------------------------------------------------------------------

    def held(self) -> list[str]:
        """Tickets held right now (for tests and inspection)."""
        return self.registry.tickets()

    def snapshot(self) -> list[wakes.HeldTask]:
        """The requests this gate holds off the pool right now, oldest first (read-only: for
        ``celery semaphore held``, through :func:`..wakes.held`)."""
        return self.registry.snapshot()
