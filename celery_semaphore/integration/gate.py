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
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery.exceptions import WorkerLostError
from redis.exceptions import RedisError

from .. import logs
from ..core import clock
from ..core.exceptions import SemaphoreError
from ..core.semaphore import HANDOFF_MARK, AttemptStatus, Semaphore
from . import children, config, events, targets, wakes
from .clients import client_for
from .delivery import (
    GATE_HEADER,
    HEADER,
    HOLDING,
    QUEUE_KEY,
    Delivery,
    Directive,
    Stage,
    WaitState,
    copy_of_execution,
    gate_nonce,
    host_owner,
    stamp_delivery,
    stamped_claim,
    task_id_of,
    ticket_of,
)
from .locks import (
    Lock,
    emit_waited,
    grant_of,
    lock_for,
    lock_kwargs,
    lock_names,
    lost_at_fence,
    lost_at_grant,
    quarantined,
    window_wait,
)
from .outage import Outage
from .spec import LimitSpec
from .standby import FREE_SLOTS, Standing, free_slots, per_semaphore

__all__ = ["MAX_HOLD", "Gate"]

log = logs.get("gate")
log_wait = logs.get("wait")
log_release = logs.get("release")

#: a held task's first wait is logged at INFO at most once per this many seconds per
#: semaphore (the others at DEBUG, counted in the next INFO line)
WAIT_INFO_EVERY = 10.0
#: semaphores whose last INFO wait line is remembered (the oldest is forgotten)
WAIT_INFO_NAMES = 1000

#: seconds a held task's place lives without a refresh (refreshed every third of it); shorter
#: with a shorter lease_ttl, so a dead node's held tasks block the line no longer than its
#: holders do, but never below HELD_PLACE_MIN
HELD_PLACE_TTL = 60.0
HELD_PLACE_MIN = 3.0
#: the longest a task is held before it is parked (re-published with a countdown); kept below
#: RabbitMQ's default consumer_timeout (30 min), and below half the Redis visibility_timeout
MAX_HOLD = 900.0
#: while Redis fails, a task held too long stays held up to this many times MAX_HOLD (still
#: below RabbitMQ's consumer_timeout and the Redis visibility_timeout), then parks regardless
PARK_ANYWAY = 1.5
#: seconds between the gate thread's maintenance passes
TICK = 1.0
#: a held task is named in wake-ups at most once per this many seconds
WAKE_GRACE = 1.0
#: the most wake-ups taken from the wake list in one go
WAKE_BATCH = 64
#: seconds between two looks at the pool children running gated bodies (prefork, Linux)
REAP_EVERY = 0.2
#: seconds the gate remembers a held task that left without a grant, in case a handoff for it
#: was already on its way: given back when the task was withdrawn, left to the pool copy that
#: carries the same claim when its place was handed over (slot, park)
LEFT_TTL = 2 * MAX_HOLD


@dataclass(eq=False)
class _Entry:
    """A limited request the gate holds, or held: its delivery (ticket, claim and stage, see
    :class:`~celery_semaphore.integration.delivery.Stage`) and what the gate needs to act for
    it."""

    req: Any  # celery.worker.request.Request
    spec: LimitSpec
    plan: targets.Plan
    sem: Lock
    opts: config.ResolvedOptions
    delivery: Delivery
    #: where a release wakes it: ``@<the gate's key>``; a single semaphore's waiter takes
    #: handoffs (``@<key>#handoff``, its claim in its owner: see Semaphore(on_handoff=...))
    wake_data: str
    state: WaitState
    owner: dict[str, Any]
    since: float = field(default_factory=clock.monotonic)
    refreshed: float = field(default_factory=clock.monotonic)
    #: counted in the consumer's prefetch window (released when the entry leaves)
    counted: bool = False
    #: a thread is talking to Redis for this entry; others leave it alone
    busy: bool = False
    #: a wake-up came while busy: try again once the current attempt is done
    again: bool = False
    #: when the pool child running its body was first seen gone (0: not seen)
    dead_since: float = 0.0
    #: place in line at the last attempt (0 = head)
    position: int | None = None
    #: seconds the place lives without a refresh
    place_ttl: float = HELD_PLACE_TTL
    #: the grant, once made: (fencing tokens, one per semaphore; lease expiry, server seconds)
    grant: tuple[list[int], float] | None = None
    granted_at: float = 0.0
    #: the hub handed it to the pool (or is doing so in this very call)
    dispatched: bool = False
    #: when a rate window (or a throttle pause) lets it start: tried again then, since no
    #: release wakes it (0: not waiting for time)
    retry_at: float = 0.0

    @property
    def ticket(self) -> str:
        return self.delivery.ticket

    @property
    def claim(self) -> str:
        return self.delivery.claim

    @property
    def stage(self) -> Stage:
        return self.delivery.stage


class Gate:
    """Holds the limited requests of one consumer that are waiting for a permit."""

    def __init__(self, consumer: Any, dispatch: Callable[[Any], Any], hold: int) -> None:
        self.consumer = consumer
        self.app = consumer.app
        self._dispatch_to_pool = dispatch
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
        self._lock = threading.Lock()
        self._held: dict[str, _Entry] = {}  # ticket -> waiting entry
        #: ticket -> (entry, when) of held tasks that left without a grant (see LEFT_TTL)
        self._left: dict[str, tuple[_Entry, float]] = {}
        self._pending: dict[str, _Entry] = {}  # ticket -> dispatched, not started yet
        #: ticket -> held entry waiting for a time (its ``retry_at``), not for a release
        self._timed: dict[str, _Entry] = {}
        self._counted = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: requests received and not tried yet, oldest first (see _take_arrivals)
        self._arrivals: deque[_Entry] = deque()
        self._arrived = threading.Condition(threading.Lock())
        self._arrivals_thread: threading.Thread | None = None
        #: look for dead pool children running gated bodies (see _reap_dead)
        self._watch_children = children.alive(os.getpid()) and not _submit_anywhere(consumer)
        self._specs: dict[str, LimitSpec | None] = {}
        #: semaphore name -> (when its last wait was logged at INFO, waits logged at DEBUG
        #: only since then); see _log_wait
        self._wait_info: dict[str, tuple[float, int]] = {}
        self._vt = config.visibility_timeout(self.app.conf)
        self._blmpop = True  # until the server says it has no BLMPOP (before Redis 7)
        #: when a Redis call last failed, and when the last tick ended (see _redis_ok)
        self._failed_at = float("-inf")
        #: Redis failing for the gate thread: logged when it starts and, counted, when it ends
        self.outage = Outage(
            log,
            "gate: Redis is failing (%s: %s); held tasks stay held, keeping their place, and "
            "none runs without a permit; logged again when it answers",
            "gate: Redis answers again after %.1fs (%d failed call(s) meanwhile); held tasks "
            "carry on",
        )
        self._tick_ended = 0.0
        #: the held task whose Redis call failed in the last tick that made any
        self._failed_on: str | None = None
        #: the pool takes work from any thread (the threads pool's executor is thread-safe),
        #: and nothing else (an autoscaler's semaphore) sits between it and the consumer
        self._direct = _submit_anywhere(consumer) and getattr(dispatch, "__name__", "") == (
            "_process_task"
        )
        #: standbys whose places stop() withdrew: after the pool stops, a grant made to one
        #: the pool never started is given back (see :meth:`after_pool_stopped`)
        self._stopped_standing: list[_Entry] = []
        #: the held tasks sent ahead to stand by in pool slots (see :mod:`.standby`)
        self._standing = Standing(
            per_semaphore(
                config.setting(self.app.conf, "semaphore_worker_standby", None),
                getattr(consumer, "pool", None),
            )
        )

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        wakes.register(self.key, self)
        wakes.register(self.handoff_key, self)
        self._thread = threading.Thread(target=self._run, name="celery-semaphore-gate", daemon=True)
        self._thread.start()
        self._arrivals_thread = threading.Thread(
            target=self._take_arrivals, name="celery-semaphore-gate-arrivals", daemon=True
        )
        self._arrivals_thread.start()

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
        with self._arrived:
            self._arrived.notify_all()
        self._interrupt_wait()
        for thread in (self._thread, self._arrivals_thread):
            if thread is not None:
                thread.join(timeout=5)
        self._thread = self._arrivals_thread = None
        with self._arrived:
            self._arrivals.clear()  # still in _held: withdrawn below, redelivered by the broker
        with self._lock:
            # left for the pool (to park or time out) but never got there: the broker delivers
            # them again, and their places must not take handoffs meanwhile
            stranded = [
                e
                for e, _ in self._left.values()
                if e.stage in (Stage.HANDED_OVER, Stage.TIMED_OUT) and not e.dispatched
            ]
            held = list(self._held.values())
            self._held.clear()
            self._timed.clear()
            # sent ahead to stand by: the pool may drop a job it has not started at stop, and
            # nobody forwards a grant any more; their places go (a body that stands by asks
            # again at its next poll, under its claim, and a grant already made stays its own)
            standing = [self._left[t][0] for t in self._standing.tickets() if t in self._left]
            for entry in standing:
                self._standing.drop(entry.ticket)
            self._stopped_standing.extend(standing)
            undispatched = [e for e in self._pending.values() if not e.dispatched]
            for entry in stranded + held + undispatched:
                entry.delivery.move(Stage.GIVEN_BACK)
            for entry in held:
                self._note_left(entry)
            self._counted = 0
            for entry in undispatched:
                del self._pending[entry.ticket]
        for entry in held + stranded:
            try:
                if not entry.sem.withdraw(entry.ticket):
                    self._give_back_handoff(entry)  # a release may have granted it meanwhile
            except SemaphoreError as exc:
                log.debug(
                    "withdraw at stop failed: %s",
                    exc,
                    semaphore=entry.sem.name,
                    task_id=entry.req.id,
                )
        for entry in undispatched:
            # no tombstone: the message was never acknowledged, and its redelivery must run
            self._release(entry, "the worker stopped before it started", tombstone_ttl=0)
        for entry in standing:
            try:
                entry.sem.withdraw(entry.ticket)  # a waiting place only: never a grant
            except SemaphoreError as exc:
                log.debug("withdraw at stop failed: %s", exc, semaphore=None, task_id=entry.req.id)

    def after_pool_stopped(self, pool: Any) -> None:
        """The pool has stopped (after :meth:`stop`): no job it was given starts any more.
        A grant handed to it whose job never started (the pool drops the jobs it has not
        started at stop) is given back now, not left to its lease; so is a grant a release
        made to a standby that never started before its place was withdrawn.  Nothing is
        done while the pool may still start a job."""
        if getattr(pool, "_state", None) != getattr(pool, "TERMINATE", None):
            return
        with self._lock:
            never = [
                e
                for e in self._pending.values()
                if e.dispatched and e.stage is Stage.RUNNING and e.req.time_start is None
            ]
            for entry in never:
                del self._pending[entry.ticket]
                entry.delivery.move(Stage.GIVEN_BACK)
            standing = [e for e in self._stopped_standing if e.req.time_start is None]
            self._stopped_standing.clear()
        for entry in never:
            # no tombstone: the message was never acknowledged, and its redelivery must run
            self._release(entry, "the worker stopped before it started", tombstone_ttl=0)
        for entry in standing:
            self._give_back_handoff(entry)  # under its claim: nothing when none was made

    def _interrupt_wait(self) -> None:
        """End the gate thread's blocking pop now rather than at its tick: an empty item on
        its own list (read as a wake-up for no ticket), so the worker stops up to a tick
        sooner.  Best effort: without it the pop still ends within ``TICK``."""
        try:
            wakes.push(self.app, self.key, "")
        except Exception as exc:  # Redis down, or no client: the tick ends the wait
            log.debug("could not interrupt the gate's wait: %s", exc, semaphore=None, task_id=None)

    # -- the consumer's side (hub thread) ---------------------------------------------------

    def on_task_request(self, req: Any) -> Any:
        """Replaces ``Consumer.on_task_request``: limited tasks pass through the gate."""
        spec = self._spec(req)
        # A grant travels only from this gate to its pool: never trust one a message brought.
        req.request_dict.pop(GATE_HEADER, None)
        if spec is None or not config.setting(self.app.conf, "semaphore_enabled", True):
            return self._dispatch_to_pool(req)
        stamp_delivery(req, self.app, self.consumer)
        try:
            entry = self._entry(req, spec)
        except (SemaphoreError, ValueError, TypeError) as exc:
            log.warning(
                "task %s: not gated (%s); it acquires in its slot",
                req.name,
                exc,
                semaphore=spec.name,
                task_id=req.id,
            )
            return self._dispatch_to_pool(req)
        with self._lock:
            if entry.ticket in self._held or entry.ticket in self._pending:
                # another delivery of the same execution is already here: the body's wrapper
                # sorts the copies out (it refuses to run two at once)
                return self._dispatch_to_pool(req)
            self._held[entry.ticket] = entry
            entry.busy = True
            # Counted in the prefetch window from now on (if it is granted at once, the count
            # goes again): the consumer keeps taking messages while the arrivals thread asks
            # Redis, rather than waiting for a round trip per limited message.
            if self._counted < self.hold:
                entry.counted = True
                self._counted += 1
        if entry.counted:
            self.consumer.qos.increment_eventually()
            self._unreserve(req)
        with self._arrived:
            self._arrivals.append(entry)
            self._arrived.notify()
        return None

    def _spec(self, req: Any) -> LimitSpec | None:
        from .decorators import spec_of

        name = req.task.name
        if name not in self._specs:
            self._specs[name] = spec_of(req.task)
        return self._specs[name]

    def _entry(self, req: Any, spec: LimitSpec) -> _Entry:
        conf = self.app.conf
        opts = config.resolve(conf, spec.options)
        headers = req.request_dict
        retries = int(headers.get("retries") or 0)
        state = WaitState.from_headers(headers.get(HEADER), retries)
        queue = req.request_dict.get(QUEUE_KEY) if state.partition is None else None
        plan = targets.resolve(
            req.task, spec, req.args, req.kwargs, queue, partition=state.partition
        )
        sem = lock_for(self.app, plan, opts.lease_ttl)
        redelivered = bool((req.delivery_info or {}).get("redelivered"))
        state = state.on_arrival(redelivered, plan.partition)
        ticket = ticket_of(req.id, retries)
        # one claim per delivery, stamped on the request: the gate's calls, the body's in the
        # pool and a release for a dead child all carry it; another delivery of the same
        # ticket never gets this one's grant
        claim = stamped_claim(req) or uuid.uuid4().hex
        # held_by: `show` and `explain` say which node holds the task, off the pool
        owner = {
            **host_owner(req.id, req.name, self.consumer.hostname),
            "claim": claim,
            "held_by": self.consumer.hostname,
        }
        if isinstance(sem, Semaphore):
            # takes handoffs (see Semaphore(on_handoff=...)): granted under its owner's claim
            wake_data = "@" + self.handoff_key
            # its own lease: the releasing task's may be shorter than this one's heartbeat
            owner.update(lease_ms=round(opts.lease_ttl * 1000))
        else:  # a group's units are granted together, by its own scripts
            wake_data = "@" + self.key
        entry = _Entry(req, spec, plan, sem, opts, Delivery(ticket, claim), wake_data, state, owner)
        entry.place_ttl = max(HELD_PLACE_MIN, min(HELD_PLACE_TTL, opts.lease_ttl))
        return entry

    # -- trying for a permit (any thread) ---------------------------------------------------

    def wake(self, ticket: str) -> None:
        """Units were freed for ``ticket``: claim them (called by a releaser of this process,
        or by the gate thread for wake-ups that came through Redis); one sent ahead to stand
        by is told on its own list."""
        with self._lock:
            entry = self._held.get(ticket)
            if entry is None:
                found = self._left.get(ticket)
                left = found[0] if found is not None else None
            elif entry.busy:
                entry.again = True
                return
            else:
                entry.busy = True
        if entry is None:
            if left is not None:
                self._forward(left, wakes.wake_item(ticket))
            return
        self._attempt(entry)

    def _attempt(self, entry: _Entry, *, first: bool = False) -> None:
        """One try_acquire for a held entry (the caller set ``entry.busy``); ``first``: its
        first, by the arrivals thread."""
        while True:
            status = self._try(entry)
            with self._lock:
                stopped = entry.stage not in HOLDING  # stop() gave it back meanwhile
                if not stopped and status is None and entry.again:
                    entry.again = False
                    continue
                entry.busy = False
                if stopped:
                    pass
                elif status is None:  # still waiting
                    if entry.retry_at:
                        self._timed[entry.ticket] = entry
                    else:
                        self._timed.pop(entry.ticket, None)
                    if entry.stage is Stage.RECEIVED:
                        entry.delivery.move(Stage.HELD)
                    if first and not entry.counted and self._counted < self.hold:
                        entry.counted = True
                        self._counted += 1
                        self.consumer.qos.increment_eventually()
                        self._unreserve(entry.req)
                    if first:
                        self._log_wait(entry)
                        emit_waited(entry.sem, entry.req.id, entry.req.name, "held", entry.position)
                else:
                    if status == "granted":
                        self._standing.turned_over(entry.sem.name)
                    self._settle(entry, status)
            if stopped:
                if status == "granted":
                    self._give_back(entry, handoff=False)
                return
            if status is not None:
                self._hand_over(entry, status)
            self._stand_by(entry.sem.name)
            return

    def _settle(self, entry: _Entry, status: str) -> None:
        """(Under the lock) ``entry`` stops waiting: it goes to the pool, with its grant
        (``granted``) or with its place and claim (``slot``, ``standby``: the body acquires
        under the same claim, so a grant a release hands off to the place meanwhile is the
        body's)."""
        self._held.pop(entry.ticket, None)
        self._timed.pop(entry.ticket, None)
        if entry.counted:
            entry.counted = False
            self._counted -= 1
            self.consumer.qos.decrement_eventually()
        if status == "granted":
            entry.delivery.move(Stage.GRANTED)
            self._pending[entry.ticket] = entry
        else:
            entry.delivery.move(Stage.HANDED_OVER)
            self._note_left(entry)

    def handed(self, ticket: str, fence: int, expires_at: float, claim: str) -> None:
        """A release granted ``ticket`` its units by handoff, under ``claim`` (see
        ``Semaphore(on_handoff=...)``): hand the request to the pool with that grant, no
        further round trip.  Called by a releaser of this process, or by the gate thread for
        handoffs that came through Redis.  Only a grant under the claim of the delivery this
        gate holds (or held) for ``ticket`` counts; any other is not this gate's to act on."""
        with self._lock:
            entry = self._held.get(ticket)
            left = None
            if entry is not None and entry.claim != claim:
                entry = None  # not this delivery's grant: looked up among those that left
            if entry is not None and self._stop.is_set():
                return  # stop() withdraws its place: finding it granted, gives it back
            if entry is None:
                pending = self._pending.get(ticket)
                if pending is not None and pending.claim == claim:
                    return  # its own attempt found the same grant first
                found = self._left.get(ticket)
                left = found[0] if found is not None and found[0].claim == claim else None
            elif entry.busy:
                entry.again = True  # the attempt under way tries again: it finds the grant
                return
            else:
                entry.busy = True
        if entry is None:
            if left is not None and self._forward(
                left, wakes.handoff_item(ticket, fence, expires_at, claim)
            ):
                return
            self._handed_elsewhere(ticket, left)
            return
        entry.refreshed = clock.monotonic()
        if quarantined(entry.sem) or lost_at_fence(entry.sem, fence):
            self._give_back_handoff(entry)  # granted on a state that was lost: hold on
            with self._lock:
                entry.busy = False
                if entry.stage is Stage.RECEIVED:
                    entry.delivery.move(Stage.HELD)
            return
        entry.grant = ([fence], expires_at)
        entry.granted_at = clock.monotonic()
        with self._lock:
            entry.busy = False
            entry.again = False
            self._standing.turned_over(entry.sem.name)
            self._settle(entry, "granted")
        self._hand_over(entry, "granted")
        self._stand_by(entry.sem.name)

    # -- standby (see .standby) -----------------------------------------------------------

    def _forward(self, entry: _Entry, item: str) -> bool:
        """``item`` (a handoff or a wake-up) is for a task this gate sent ahead to stand by:
        push it onto the task's own list (one round trip, no hop through the event loop or
        the pool), and, for a grant, send the next held task ahead.  False when ``entry``
        does not stand by (any more)."""
        granted = item.startswith("h ")
        with self._lock:
            if not self._standing.has(entry.ticket, entry.claim):
                return False
            name = self._standing.granted(entry.ticket, entry.claim) if granted else None
        try:
            wakes.push(
                self.app,
                wakes.standby_key(self.key, entry.claim),
                item,
                ttl=wakes.STANDBY_TTL,
            )
        except RedisError as exc:
            # the task finds its grant at its next poll (its place is held under its claim)
            self._failed_at = clock.monotonic()
            log.debug("could not forward to a standby: %s", exc, semaphore=None, task_id=None)
        if name is not None:
            self._stand_by(name)
        return True

    def _cancel_if_revoked(self, entry: _Entry) -> None:
        """A task standing by in a pool slot was revoked (or expired): tell it, on its list,
        so that it leaves the line and does not run (a held task is dropped the same way)."""
        req = entry.req
        if not (req.id in _revoked() or (req.expires and _expired(req))):
            return
        with self._lock:
            self._standing.drop(entry.ticket)
        try:
            wakes.push(
                self.app,
                wakes.standby_key(self.key, entry.claim),
                wakes.cancel_item(entry.ticket, entry.claim),
                ttl=wakes.STANDBY_TTL,
            )
        except RedisError as exc:  # it runs once granted, as a revoked running task would
            self._failed_at = clock.monotonic()
            log.debug("could not cancel a standby: %s", exc, semaphore=None, task_id=req.id)

    def _stand_by(self, name: str) -> None:
        """Send the first held tasks of the semaphore ``name`` ahead, into free pool slots,
        while it has room for more standbys (``semaphore_worker_standby``), it turns over on
        this worker, and the pool keeps a slot free for other work."""
        if self._stop.is_set():
            return
        chosen: list[_Entry] = []
        with self._lock:
            want = self._standing.wanted(name)
            if want <= 0 or not self._held:
                return
            # standbys not yet started in the pool are not in its count of active requests
            room = free_slots(self.consumer.pool) - self._standing.total() - (FREE_SLOTS - 1)
            want = min(want, room)
            for entry in self._held.values():
                if len(chosen) >= want:
                    break
                if (
                    entry.sem.name == name
                    and entry.stage is Stage.HELD
                    and not entry.busy
                    and not entry.retry_at
                    and isinstance(entry.sem, Semaphore)
                    and entry.opts.wait_timeout > 0
                    and not _time_limited(entry.req)
                ):
                    chosen.append(entry)
            for entry in chosen:
                self._settle(entry, "standby")
                self._standing.add(entry.ticket, name, entry.claim, entry.opts.wait_timeout)
        for entry in chosen:
            self._hand_over(entry, "standby")

    def _handed_elsewhere(self, ticket: str, left: _Entry | None) -> None:
        """A handoff for ``ticket`` that no held delivery here takes: ``left`` is the delivery
        it was made for, which left this gate (None: none with that claim)."""
        if left is not None and left.stage is Stage.HANDED_OVER:
            # its place and claim went to the pool (slot, park): the body acquires under the
            # same claim and finds this grant its own; giving it back could free a running body
            log.debug(
                "a handoff for ticket %s, whose place went to the pool with its claim",
                ticket,
                semaphore=left.sem.name,
                task_id=left.req.id,
            )
        elif left is not None:
            self._give_back_handoff(left)  # withdrawn (revoked, timed out, stopped)
        else:
            log.warning(
                "a handoff for ticket %s under a claim of no delivery this gate holds; its "
                "permit, if any, comes back when its lease expires",
                ticket,
                semaphore=None,
                task_id=task_id_of(ticket),
            )

    def _give_back_handoff(self, entry: _Entry) -> None:
        """Give back a grant a handoff may have made to ``entry`` (no longer held here); it is
        not handed off again (its place may still name this gate)."""
        if isinstance(entry.sem, Semaphore):  # a group's grants are never handed off
            self._give_back(entry, handoff=False)

    def _note_left(self, entry: _Entry) -> None:
        """(Under the lock) ``entry`` left without a grant (see LEFT_TTL)."""
        now = clock.monotonic()
        self._left[entry.ticket] = (entry, now)
        while self._left:
            oldest = next(iter(self._left))
            if now - self._left[oldest][1] < LEFT_TTL and len(self._left) <= 10000:
                break
            del self._left[oldest]

    def _try(self, entry: _Entry) -> str | None:
        """None while waiting; else what to do with the request: ``granted`` (run it with the
        grant) or ``slot`` (let the body's wrapper acquire: a redelivered copy whose previous
        delivery holds the permit, a duplicate, or Redis failing at the first try)."""
        state = entry.state
        entry.retry_at = 0.0  # only a fresh WAITING reply sets a time to try again
        if quarantined(entry.sem):
            return None  # the state was lost: hold on until the running bodies re-assert
        try:
            attempt = entry.sem.try_acquire(
                entry.ticket,
                owner=entry.owner,
                place_ttl=entry.place_ttl,
                claim=entry.claim,
                wake_data=entry.wake_data,
                wake_grace=WAKE_GRACE,
                epoch=state.epoch,
                # a copy of an execution may have run already; a first delivery is a new request
                check_done=copy_of_execution(state),
                new_execution=not copy_of_execution(state),
                lease_ttl=entry.opts.lease_ttl,
                **lock_kwargs(entry.plan),
            )
        except SemaphoreError as exc:
            self._failed_at = clock.monotonic()
            # Fail closed: keep holding (a held task never runs without a permit), try again
            # at the next tick.  A task Redis fails for on arrival goes to its slot instead,
            # where the wrapper parks it, so a Redis outage does not fill the consumer.
            waits = entry.counted and entry.stage is Stage.HELD
            log.warning(
                "task %s: semaphore unavailable (%s); %s",
                entry.req.name,
                exc,
                "it waits" if waits else "it goes to its slot to park",
                semaphore=entry.sem.name,
                task_id=entry.req.id,
            )
            return None if waits else "slot"
        except ValueError as exc:  # e.g. a weight above a lowered runtime limit
            log.error(
                "task %s: %s; it goes to its slot",
                entry.req.name,
                exc,
                semaphore=entry.sem.name,
                task_id=entry.req.id,
            )
            return "slot"
        entry.refreshed = clock.monotonic()
        if (
            attempt.status is AttemptStatus.GRANTED
            and attempt.permit is not None
            and lost_at_grant(entry.sem, attempt.permit)
        ):
            # granted on a state that was lost: give it back, hold on (fail closed)
            self._give_back(entry)
            return None
        if attempt.permit is not None:
            entry.grant = (grant_of(attempt.permit), attempt.permit.lease_expires_at)
            entry.granted_at = clock.monotonic()
            return "granted"
        if attempt.status is AttemptStatus.WAITING:
            entry.position = attempt.position
            after = attempt.rate_retry_after
            if after is not None:
                wait = window_wait(entry.sem, attempt.position or 0, after)
                if wait is not None:
                    entry.retry_at = clock.monotonic() + wait
            return None
        return "slot"

    def _give_back(self, entry: _Entry, *, handoff: bool = True) -> None:
        """Release a grant ``entry`` will not use; ``handoff=False``: the units go to no
        waiter by handoff (see :meth:`_give_back_handoff`)."""
        sem = entry.sem
        try:
            if isinstance(sem, Semaphore) and not handoff:
                sem.release_token(
                    entry.ticket, claim=entry.claim, tombstone_ttl=0, timed=False, handoff=False
                )
            else:
                sem.release_token(entry.ticket, claim=entry.claim, tombstone_ttl=0, timed=False)
        except SemaphoreError as exc:
            log.warning(
                "could not give back a grant: %s",
                exc,
                semaphore=entry.sem.name,
                task_id=entry.req.id,
            )

    def _log_wait(self, entry: _Entry) -> None:
        """(Under the lock) a held task's first wait: at DEBUG every time; at INFO the first
        wait of a semaphore, then at most one per :data:`WAIT_INFO_EVERY` seconds per
        semaphore, counting the waits logged at DEBUG only meanwhile (a flood of arrivals
        would otherwise log one INFO line per task)."""
        name = entry.sem.name
        now = clock.monotonic()
        found = self._wait_info.get(name)
        quiet = 0 if found is None else found[1]
        loud = found is None or now - found[0] >= WAIT_INFO_EVERY
        if found is not None and not loud:
            self._wait_info[name] = (found[0], quiet + 1)
        else:
            self._wait_info.pop(name, None)  # the least recently logged first
            self._wait_info[name] = (now, 0)
            if len(self._wait_info) > WAIT_INFO_NAMES:  # dynamic names: forget the oldest
                del self._wait_info[next(iter(self._wait_info))]
        (log_wait.info if loud else log_wait.debug)(
            "task %s waits (limit %d, position %s): held by a worker (this one), off the pool, "
            "until a release wakes it%s%s",
            entry.req.name,
            entry.sem.limit,
            entry.position,
            "" if entry.counted else " (semaphore_worker_hold is full: in the prefetch window)",
            f"; {quiet} more task(s) waited meanwhile (logged at DEBUG)" if loud and quiet else "",
            semaphore=name,
            task_id=entry.req.id,
        )

    def _unreserve(self, req: Any) -> None:
        # A held request is not waiting for a pool slot: keep it out of reserved_requests,
        # which worker_disable_prefetch counts against the pool size.
        from celery.worker import state

        state.reserved_requests.discard(req)

    def _hand_over(self, entry: _Entry, status: str) -> None:
        """Send the request to the pool, from the hub thread (or directly, when the pool takes
        work from any thread)."""
        directive: Directive | None = None
        if status == "standby":
            directive = self._directive(
                entry, "standby", wake=wakes.standby_key(self.key, entry.claim)
            )
        elif status == "granted" and entry.grant is not None:
            waited = time.time() - entry.state.first_wait if entry.state.first_wait else 0.0
            fencing, expires_at = entry.grant
            directive = self._directive(
                entry,
                "run",
                fencing=tuple(fencing),
                expires_at=expires_at,
                waited=waited,
                granted_at=entry.granted_at,
            )
            if entry.position is not None:  # it waited
                log_wait.debug(
                    "task %s: granted after %.3fs held; to the pool",
                    entry.req.name,
                    clock.monotonic() - entry.since,
                    semaphore=entry.sem.name,
                    task_id=entry.req.id,
                )
        if self._direct and not _maybe_revoked(entry.req):
            # a pool any thread may submit to (threads): one thread hop less between the
            # release and the next body
            self._dispatch(entry, directive)
        else:
            self.consumer.call_soon(self._dispatch, entry, directive)

    def _directive(self, entry: _Entry, do: str, **extra: Any) -> Directive:
        return Directive(
            self.nonce,
            entry.ticket,
            entry.claim,
            do,
            entry.plan.partition,
            plan=entry.plan.to_wire(),
            **extra,
        )

    def _dispatch(self, entry: _Entry, directive: Directive | None) -> None:
        req = entry.req
        with self._lock:
            if entry.stage is Stage.GIVEN_BACK:
                return  # the gate stopped and gave its grant back; the message is redelivered
            entry.dispatched = True
            if entry.stage is Stage.GRANTED:
                entry.delivery.move(Stage.RUNNING)
        if entry.stage in (Stage.RUNNING, Stage.HANDED_OVER) and req.revoked():
            # revoked on its way: revoked() acknowledged it, and the pool would drop it; what
            # it took with it goes back (its grant, or its place and any grant to it)
            if entry.stage is Stage.RUNNING:
                self._forget_pending(entry)
                self._release(entry, "it was revoked before it started")
            else:
                self._withdraw(entry, "it was revoked on its way to the pool")
            return
        if directive is not None:
            req.request_dict[GATE_HEADER] = directive.to_request()
            if directive.do in ("run", "standby"):
                # a standby's grant, if a release made it before the child died, likewise
                self._watch_failure(entry)
        from celery.worker import state

        state.task_reserved(req)
        try:
            self._dispatch_to_pool(req)
        except Exception:
            self._forget_pending(entry)
            if directive is not None and directive.do == "run":
                self._release(entry, "the pool refused it")
            raise

    def _watch_failure(self, entry: _Entry) -> None:
        """Release in this process when the pool loses the process that ran the body (SIGKILL,
        OOM; also with ``reject_on_worker_lost``, where Celery sends no ``task_failure``)."""
        req = entry.req
        original = req.on_failure

        def on_failure(exc_info: Any, *args: Any, **kwargs: Any) -> Any:
            exc = getattr(exc_info, "exception", None)
            exc = getattr(exc, "exc", exc)  # billiard's ExceptionWithTraceback wraps it
            if isinstance(exc, WorkerLostError):
                # Before Celery's own handling, whose task_failure signal would release it
                # too (and log it a second time): that release then finds nothing held.
                # No tombstone: a redelivery (reject_on_worker_lost) must run, not drop.
                try:
                    self._release(
                        entry, "the process running it was lost", tombstone_ttl=0, timed=True
                    )
                except Exception as err:  # never keep Celery from handling the failure
                    log_release.error(
                        "could not release the permit of task %s: %s: %s",
                        req.name,
                        type(err).__name__,
                        err,
                        semaphore=entry.sem.name,
                        task_id=req.id,
                    )
            return original(exc_info, *args, **kwargs)

        req.on_failure = on_failure

    def _release(
        self, entry: _Entry, why: str, tombstone_ttl: float | None = None, timed: bool = False
    ) -> None:
        """Release for the task when its body will not release itself; ``timed`` when the
        body ran (its hold counts in the hold-time average), not when it never started."""
        try:
            # only_now: a body that released its permit before its process was reported lost
            # (or the pool dropped a finished job at stop) is no crash to log
            released = entry.sem.release_token(
                entry.ticket,
                claim=entry.claim,
                tombstone_ttl=tombstone_ttl,
                timed=timed,
                only_now=True,
            )
        except SemaphoreError as exc:
            log_release.error(
                "could not release the permit of task %s after %s: %s; it comes back when its "
                "lease expires",
                entry.req.name,
                why,
                exc,
                semaphore=entry.sem.name,
                task_id=entry.req.id,
            )
            return
        if released:
            # no tombstone, and not at stop: the process running it was lost
            if tombstone_ttl == 0 and entry.stage is not Stage.GIVEN_BACK:
                for name in lock_names(entry.sem):
                    events.emit(
                        "reclaimed", name=name, count=1, reason="crashed", task_id=entry.req.id
                    )
            log_release.warning(
                "released the permit of task %s: %s",
                entry.req.name,
                why,
                semaphore=entry.sem.name,
                task_id=entry.req.id,
            )

    def _forget_pending(self, entry: _Entry) -> None:
        """Its request is done in the pool (or its grant is released for it)."""
        with self._lock:
            if self._pending.get(entry.ticket) is entry:
                del self._pending[entry.ticket]
                entry.delivery.move(Stage.DONE)

    # -- the gate thread ----------------------------------------------------------------------

    def _run(self) -> None:
        next_tick = clock.monotonic() + TICK
        client: Any = None
        while not self._stop.is_set():
            items: list[str] = []
            try:
                if client is None:
                    client = self._client()
                now = clock.monotonic()
                wait = max(0.01, min(TICK, next_tick - now, self._next_retry() - now))
                items = self._take_wakes(client, wait)
                self.outage.ok()
            except Exception as exc:
                # Redis failing: no wake-ups, but the tick still runs (revoked tasks go, those
                # past max_wait time out, those held too long park), without Redis calls
                self._carry_on(exc)
                client = None
                self._stop.wait(0.5)
            try:
                for item in items:
                    found = wakes.parse(item)
                    if isinstance(found, wakes.Handoff):
                        self.handed(found.ticket, found.fence, found.expires_at, found.claim)
                    elif isinstance(found, wakes.Wake):
                        self.wake(found.ticket)
                if self._redis_ok():  # while Redis fails, the tick alone acts (no calls)
                    self._retry_due()
                if clock.monotonic() >= next_tick:
                    self._tick()
                    next_tick = clock.monotonic() + TICK
            except Exception as exc:  # never let the gate die: held tasks depend on it
                self._carry_on(exc)
                self._stop.wait(0.5)

    def _next_retry(self) -> float:
        """When the first held task waiting for a time (a rate window) is due."""
        with self._lock:
            return min((e.retry_at for e in self._timed.values()), default=float("inf"))

    def _retry_due(self) -> None:
        """Try again the held tasks whose time came: no release wakes a task held by a rate
        window, so the gate does when the window opens (the script said when)."""
        now = clock.monotonic()
        with self._lock:
            due = [e for e in self._timed.values() if e.retry_at <= now]
            for entry in due:
                del self._timed[entry.ticket]
        for entry in due:
            self.wake(entry.ticket)

    def _carry_on(self, exc: Exception) -> None:
        self._failed_at = clock.monotonic()
        if isinstance(exc, RedisError):  # once per outage, counted when it ends
            self.outage.failed(exc)
        else:  # a bug: every time
            log.warning(
                "gate: %s: %s; carrying on", type(exc).__name__, exc, semaphore=None, task_id=None
            )

    def _take_arrivals(self) -> None:
        """The arrivals thread: the first attempt of every request received, in order; and,
        on prefork, a look at the children running gated bodies every :data:`REAP_EVERY`."""
        next_reap = 0.0
        while not self._stop.is_set():
            with self._arrived:
                if not self._arrivals:
                    self._arrived.wait(REAP_EVERY if self._watch_children else TICK)
                if self._stop.is_set():
                    return
                entry = self._arrivals.popleft() if self._arrivals else None
            if self._watch_children and clock.monotonic() >= next_reap:
                next_reap = clock.monotonic() + REAP_EVERY
                try:
                    self._reap_dead()
                except Exception as exc:  # never let it die: arrivals depend on it
                    log.warning(
                        "gate: looking at pool children failed: %s: %s; carrying on",
                        type(exc).__name__,
                        exc,
                        semaphore=None,
                        task_id=None,
                    )
            if entry is None:
                continue
            try:
                self._attempt(entry, first=True)
            except Exception as exc:  # never let it die; the tick retries the entry
                with self._lock:
                    entry.busy = False
                log.warning(
                    "gate: first attempt failed: %s: %s; retried at the next tick",
                    type(exc).__name__,
                    exc,
                    semaphore=entry.sem.name,
                    task_id=entry.req.id,
                )

    def _reap_dead(self) -> None:
        """Release the permit of a gated body whose pool child died under it (SIGKILL, OOM)
        once the child is gone, by ticket: billiard reports the lost process (and Celery calls
        ``on_failure``) only when it notices, sometimes seconds later.  A child seen gone is
        given :data:`REAP_EVERY` for its last result to reach the consumer (a child that
        exits after finishing, e.g. ``max_tasks_per_child``, released its permit itself)."""

        me = os.getpid()
        now = clock.monotonic()
        with self._lock:
            running = [e for e in self._pending.values() if e.stage is Stage.RUNNING]
        for entry in running:
            req = entry.req
            pid = getattr(req, "worker_pid", None)
            if not pid or pid == me or not _in_pool(req):
                continue
            if children.alive(pid):
                entry.dead_since = 0.0
                continue
            if not entry.dead_since:
                entry.dead_since = now
                continue
            if now - entry.dead_since < REAP_EVERY:
                continue
            self._forget_pending(entry)
            # no tombstone: a redelivery (reject_on_worker_lost) must run, not drop
            self._release(entry, "the process running it died", tombstone_ttl=0, timed=True)

    def _client(self) -> Any:
        return client_for(config.redis_url_for(self.app.conf), self.app.conf)

    def _take_wakes(self, client: Any, wait: float) -> list[str]:
        """Wake-ups and handoffs from the gate's two lists (plain tickets, or
        ``+<fence> <expiry ms> <ticket>``), a batch of one list at a time."""
        tickets: list[Any] = []
        keys = (self.handoff_key, self.key)
        if self._blmpop:
            # Redis 7: one round trip takes the whole batch
            try:
                found = client.blmpop(wait, len(keys), *keys, direction="LEFT", count=WAKE_BATCH)
            except RedisError as exc:
                if not _no_such_command(exc):
                    raise
                self._blmpop = False  # Redis 6: BLPOP, then LPOP the rest
            else:
                tickets = list(found[1]) if found else []
        if not self._blmpop:
            first = client.blpop(list(keys), timeout=wait)
            if first is None:
                return []
            tickets = [first[1]]
            more = client.lpop(first[0], WAKE_BATCH)
            if more:
                tickets.extend(more)
        return [t.decode() if isinstance(t, bytes) else str(t) for t in tickets]

    def _tick(self) -> None:
        now = clock.monotonic()
        with self._lock:
            held = [e for e in self._held.values() if not e.busy]
            pending = list(self._pending.values())
            self._standing.expire()
            standing = [self._left.get(t) for t in self._standing.tickets()]
        for found in standing:
            if found is not None:
                self._cancel_if_revoked(found[0])
        for name in sorted({e.sem.name for e in held}):
            self._stand_by(name)
        # While Redis fails (a call failed since the last tick ended), a tick makes no Redis
        # calls: each would wait out its retries, and the tick's local decisions with them.
        # The next tick starts after the entry whose call failed, so one that always fails
        # (its Redis Cluster node is down) does not keep those behind it from their turn.
        for entry in _after(held, self._failed_on):
            redis_ok = self._redis_ok()
            self._maintain(entry, now, redis_ok)
            if redis_ok and not self._redis_ok():
                self._failed_on = entry.ticket
        for entry in pending:
            if self._redis_ok():
                self._maintain_pending(entry, now)
        self._tick_ended = clock.monotonic()

    def _redis_ok(self) -> bool:
        return self._failed_at < self._tick_ended

    def _maintain(self, entry: _Entry, now: float, redis_ok: bool) -> None:
        req = entry.req
        waited = time.time() - (entry.state.first_wait or time.time())
        max_wait = entry.opts.max_wait
        if req.id in _revoked() or (req.expires and _expired(req)):
            self._leave(entry, None, "revoked", withdraw=redis_ok)
        elif max_wait is not None and waited >= max_wait:
            directive = self._directive(entry, "timeout", waited=waited)
            self._leave(entry, directive, "timed out", withdraw=redis_ok)
        elif now - entry.since >= self._max_hold():
            self._park_held(entry, now, redis_ok)
        elif not redis_ok:
            return
        elif now - entry.refreshed >= entry.place_ttl / 3 or not (
            entry.counted and entry.stage is Stage.HELD
        ):
            # keep the place alive (and claim units whose wake-up was lost); an uncounted
            # entry (over semaphore_worker_hold, or Redis failed), or one whose first attempt
            # failed, retries every tick
            with self._lock:
                if entry.busy or self._held.get(entry.ticket) is not entry:
                    return
                entry.busy = True
            self._attempt(entry)

    def _park_held(self, entry: _Entry, now: float, redis_ok: bool) -> None:
        """Held too long: send it to the pool to park (keeping its place in line).

        First one more try, with a plain wake-up address in place of the handoff one.  From
        then on a release only names this ticket (the wrapper that parks it claims the units).
        A handoff made before this try is found by it: the task then runs with that grant.
        One made later (Redis failed at this try) is the wrapper's own: it parks under this
        delivery's claim, which the gate hands over with the place.  While Redis fails
        (or the state is in quarantine) it stays held, tried again at the next tick, up to
        :data:`PARK_ANYWAY` times the longest hold: then it parks regardless (its wrapper parks
        on the countdown alone), before the broker would deliver the message again."""
        answered = False
        if redis_ok:
            with self._lock:
                if entry.busy or self._held.get(entry.ticket) is not entry:
                    return
                entry.busy = True
            entry.wake_data = "@" + self.key
            asked = entry.refreshed  # set again only when Redis answers
            self._attempt(entry)
            answered = entry.refreshed != asked and not quarantined(entry.sem)
        if answered or now - entry.since >= PARK_ANYWAY * self._max_hold():
            self._leave(entry, self._directive(entry, "park"), "held too long")

    def _leave(
        self, entry: _Entry, directive: Directive | None, why: str, withdraw: bool = True
    ) -> None:
        """Stop holding ``entry``: drop it (revoked) or send it to the pool with a directive
        (``timeout``: fail with SemaphoreTimeout; ``park``: re-publish with a countdown).
        ``withdraw=False`` (Redis failing): a place it gives up is left to expire."""
        with self._lock:
            if entry.busy or self._held.get(entry.ticket) is not entry:
                return
            del self._held[entry.ticket]
            self._timed.pop(entry.ticket, None)
            if directive is None:
                entry.delivery.move(Stage.REVOKED)
            elif directive.do == "timeout":
                entry.delivery.move(Stage.TIMED_OUT)
            else:  # park: with its place and claim
                entry.delivery.move(Stage.HANDED_OVER)
            self._note_left(entry)
            if entry.counted:
                entry.counted = False
                self._counted -= 1
                self.consumer.qos.decrement_eventually()
        if entry.stage is not Stage.HANDED_OVER and withdraw:
            self._withdraw(entry, why)
        log_wait.info(
            "task %s: %s after %.1fs held",
            entry.req.name,
            why,
            clock.monotonic() - entry.since,
            semaphore=entry.sem.name,
            task_id=entry.req.id,
        )
        if directive is None:
            self.consumer.call_soon(entry.req.revoked)
        else:
            self.consumer.call_soon(self._dispatch, entry, directive)

    def _withdraw(self, entry: _Entry, why: str) -> None:
        """Take ``entry``'s place out of line, and give back a grant a release made to it
        meanwhile (under its claim)."""
        try:
            if not entry.sem.withdraw(entry.ticket):
                self._give_back_handoff(entry)  # a release may have granted it meanwhile
        except SemaphoreError as exc:
            self._failed_at = clock.monotonic()
            log_wait.warning(
                "withdraw failed (%s): %s", why, exc, semaphore=entry.sem.name, task_id=entry.req.id
            )

    def _maintain_pending(self, entry: _Entry, now: float) -> None:
        """A grant handed to the pool: keep its lease alive until the body starts and its own
        heartbeat takes over; forget it once the request is done (until then, on prefork,
        :meth:`_reap_dead` watches the child running it)."""

        req = entry.req
        if entry.dispatched and not _in_pool(req):
            self._forget_pending(entry)
            return
        if req.time_start is not None:
            return
        if now - entry.granted_at >= entry.opts.heartbeat_interval:
            entry.granted_at = now
            try:
                entry.sem.refresh_token(entry.ticket, holder_only=True, claim=entry.claim)
            except SemaphoreError as exc:
                self._failed_at = clock.monotonic()
                log.warning(
                    "refresh of a pending grant failed: %s",
                    exc,
                    semaphore=entry.sem.name,
                    task_id=entry.req.id,
                )

    def _max_hold(self) -> float:
        return MAX_HOLD if self._vt is None else min(MAX_HOLD, self._vt / 2)

    # -- inspection ---------------------------------------------------------------------------

    def held(self) -> list[str]:
        """Tickets held right now (for tests and inspection)."""
        with self._lock:
            return list(self._held)

    def snapshot(self) -> list[wakes.HeldTask]:
        """The requests this gate holds off the pool right now, oldest first (read-only: for
        ``celery semaphore held``, through :func:`.wakes.held`)."""
        now = clock.monotonic()
        with self._lock:
            entries = sorted(self._held.values(), key=lambda e: e.since)
            return [
                wakes.HeldTask(
                    task_id=str(e.req.id),
                    task=str(e.req.name),
                    semaphore=e.sem.name,
                    stage=e.stage.value,
                    waited=round(now - e.since, 3),
                    position=e.position,
                    counted=e.counted,
                )
                for e in entries
            ]


def _after(entries: list[_Entry], ticket: str | None) -> list[_Entry]:
    """``entries`` starting after the one holding ``ticket`` (all of them, in order, when
    none does)."""
    for i, entry in enumerate(entries):
        if entry.ticket == ticket:
            return entries[i + 1 :] + entries[: i + 1]
    return entries


def _in_pool(req: Any) -> bool:
    """Is ``req`` (this very request object, not just its task id: another message may reuse
    the id) reserved for the pool or running there?"""
    from celery.worker import state

    return req in state.reserved_requests or req in state.active_requests


def _submit_anywhere(consumer: Any) -> bool:
    """May work be handed to this consumer's pool from any thread?  The threads pool's
    executor is thread-safe; green pools (gevent, eventlet) run every "thread" as a greenlet
    of one OS thread (and have no hub to hand work back through)."""
    from celery.concurrency.thread import TaskPool

    pool = getattr(consumer, "pool", None)
    return isinstance(pool, TaskPool) or bool(getattr(pool, "is_green", False))


def _time_limited(req: Any) -> bool:
    """Has the task a time limit?  Its clock starts when the pool starts it, so it would run
    while the task stands by: such a task waits held instead."""
    soft, hard = getattr(req, "time_limits", (None, None)) or (None, None)
    task = req.task
    return bool(soft or hard or task.soft_time_limit or task.time_limit)


def _maybe_revoked(req: Any) -> bool:
    """Might ``req.revoked()`` act (acknowledge, announce)?  Then it must run on the hub."""
    return bool(req.expires) or req.id in _revoked()


def _revoked() -> Any:
    from celery.worker.state import revoked

    return revoked


def _expired(req: Any) -> bool:
    from datetime import datetime, timezone

    expires = req.expires
    return bool(expires is not None and expires <= datetime.now(timezone.utc))


def _no_such_command(exc: Exception) -> bool:
    """The server (Redis 6: "unknown command") or redis-py's cluster client, which checks its
    node's command table first ("... doesn't exist in Redis commands"), has no such command."""
    text = str(exc).lower()
    return "unknown command" in text or "doesn't exist in redis commands" in text
