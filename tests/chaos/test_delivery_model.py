"""Random sequences of task deliveries through workers' gates, on a real Redis.

One or two "nodes" (each a :class:`Gate` in front of a stand-in consumer whose hub, arrivals
thread and pool run only when a rule says so) share one semaphore of limit 1 or 2.  The rules
send tasks, send a task id again (a second message), redeliver a message whose body runs or
ran, run the gate's first attempts, the hub's callbacks, the pool's bodies (each in a thread of
its own, through Celery's tracer with the request the gate dispatched, so several bodies can be
inside at once), end bodies (or make them fail), deliver the wake-ups and handoffs on a gate's
wake lists in Redis in any order or lose them, take and release units from "another process"
whose wake-ups and handoffs arrive late or never, let time pass (the package's clock seam) and
tick a gate, revoke a task, stop a gate (its unacknowledged messages are delivered again to a
live node) and start a new one, and deliver the copies the bodies publish (parked copies, wake
copies) from a stand-in broker.

After every step, counted by the bodies themselves and never read from the semaphore: no more
than ``limit`` bodies (and outside units) inside at once, never two bodies of one task id at
once, and every body inside holds its permit in Redis under its own delivery's claim; Redis's
``used`` never above the limit.  At the end everything is driven to completion (bounded
rounds): every task id sent once ran exactly once, one sent several times ran at least once and
at most that often (unless revoked or timed out), every delivery ended visibly (ran, failed,
dropped as a duplicate, parked, revoked, timed out, or delivered again after its node stopped),
no gate holds anything, and nothing is held or waiting in Redis.

Three known defects are tolerated, each behind a flag below (set it to False to see it fail):
places left in line by a copy that finds its ticket done, or by a parked task revoked on its
way to the pool, and a timeout handed to the pool by the hub of a stopped worker.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery, Task, states
from celery.app.trace import build_tracer
from celery.worker import state as worker_state
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import celery_semaphore.core.clock as clock_module
import celery_semaphore.integration.gate.dispatch as gate_dispatch_module
import celery_semaphore.integration.gate.upkeep as gate_upkeep_module
import celery_semaphore.integration.gated as gated_module
import celery_semaphore.integration.heartbeat as heartbeat_module
import celery_semaphore.integration.hold as hold_module
import celery_semaphore.integration.locks as locks_module
import celery_semaphore.integration.park as park_module
import celery_semaphore.integration.wait_state as wait_state_module
from celery_semaphore import Semaphore, limited
from celery_semaphore.core.exceptions import SemaphoreTimeout
from celery_semaphore.integration import wakes
from celery_semaphore.integration.delivery import CLAIM_KEY, GATE_HEADER, QUEUE_KEY
from celery_semaphore.integration.gate import Gate
from celery_semaphore.integration.gate.timing import HELD_PLACE_TTL, LEFT_TTL, MAX_HOLD
from celery_semaphore.integration.heartbeat import heartbeat
from celery_semaphore.integration.locks import semaphore_for
from celery_semaphore.integration.wait_state import HEADER
from celery_semaphore.ops.testing import RedisServer

from .gate_stubs import StoppedConsumer, gate_app

# a passing run takes seconds; a failing one, the time Hypothesis takes to shrink (<= 5 min)
pytestmark = [pytest.mark.chaos, pytest.mark.timeout(420)]

LEASE = 60.0  # leases and held places never run out on their own during an example
#: seconds a task may wait in all (``max_wait``): reached only when the test lets time pass
MAX_WAIT = 950.0
#: time that lets a tick refresh every held place (and retry its claim) and every pending grant
REFRESH = HELD_PLACE_TTL / 3 + 1
#: time that makes every held task "held too long" (parked)
HOLD = MAX_HOLD + 1
#: the most time a random sequence lets pass: a late handoff is never older than LEFT_TTL
BUDGET = LEFT_TTL - 300
#: seconds a body thread may take to start or end (it never waits for Redis that long)
SETTLE = 10.0
MAX_SENDS = 10
MAX_NODES = 4
DRAIN_ROUNDS = 40
PICK = st.integers(min_value=0, max_value=7)  # an index into a list, modulo its length
#: A known defect, tolerated so that the machine goes on looking for others (False: report it).
#: A copy of an execution that finds its ticket done (a tombstone) is dropped, but its place in
#: line stays: a second send of a task id parks (its body finds the first send done, and the
#: units handed to another waiter), its parked copy finds the ticket done and drops, and the
#: place stays at the head of the line, named in every release (a wake copy each time, each
#: dropped), keeping the free units from everyone behind it until it expires
#: (countdown + max(PLACE_SLACK, lease_ttl)).  Tolerated: at the end, such a place (its ticket
#: done, no delivery of its task left) is expired by hand, as time would.
TOLERATE_DONE_PLACES = False
#: A known defect, tolerated likewise (False: report it).  A held task the gate sends to the
#: pool to park (held too long), revoked before the hub hands it over: Celery's
#: ``execute_using_pool`` discards the revoked request, and the place the gate handed over
#: with it stays at the head of the line (named in releases, the gate ignoring the wake-ups)
#: until it expires (``place_ttl``, up to 60 s).
TOLERATE_REVOKED_PLACES = False
#: A known defect, tolerated likewise (False: report it).  A held task that reaches max_wait
#: leaves the gate with a "timeout" hand-over for the hub; ``Gate.stop()`` cancels the
#: hand-overs of grants and parks but not that one, so a hub that runs its callbacks after the
#: stop (a consumer restarting after a lost connection) hands the timeout to the pool although
#: the message, never acknowledged, is delivered again: the task fails with SemaphoreTimeout
#: and runs (or waits) again elsewhere.
TOLERATE_TIMEOUT_AFTER_STOP = False


class Clock:
    """The package's clock seam (``celery_semaphore.core.clock``): real monotonic time plus
    the time the test made pass; and the wall clock of the modules that measure a task's wait
    for ``max_wait`` (``time.time()``), which the test moves apart, so that time passing only
    to drive ticks never times a task out.  Redis keeps real time: leases and places stay."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.wall_offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def time(self) -> float:
        return time.time() + self.wall_offset


class Broker:
    """Stands in for ``apply_async`` of the model's task: the copies bodies publish (a parked
    copy, with its countdown) and releases publish (a parked task's wake copy) are kept here
    until a rule delivers them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.messages: list[tuple[str, dict[str, Any] | None]] = []  # task id, wait header
        self.published_by: dict[int, int] = {}  # thread id -> parked copies it published

    def publish(self, task_id: str, options: dict[str, Any]) -> None:
        headers = options.get("headers") or {}
        header = headers.get(HEADER)
        parked = "countdown" in options
        with self.lock:
            self.messages.append((task_id, header if isinstance(header, dict) else None))
            if parked:
                me = threading.get_ident()
                self.published_by[me] = self.published_by.get(me, 0) + 1


class ModelTask(Task):  # type: ignore[misc]
    """The model's task: what it publishes goes to the machine's broker."""

    broker: Broker

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        **options: Any,
    ) -> None:
        assert task_id is not None, "a copy without the task id"
        self.broker.publish(task_id, options)


class Late:
    """Wake-ups and handoffs of releases made "in another process", kept until a rule
    delivers them (through the Celery layer's own router) or loses them."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, tuple[int, float, str] | None]] = []

    def on_wake(self, ticket: str, data: str) -> None:
        self.items.append((ticket, data, None))

    def on_handoff(self, ticket: str, data: str, fence: int, expires_at: float, claim: str) -> None:
        self.items.append((ticket, data, (fence, expires_at, claim)))


class ModelRequest:
    """One delivery's request: the parts of ``celery.worker.request.Request`` the gate uses;
    ``revoked()`` acts like Celery's (it acknowledges a revoked message: the delivery ends)."""

    def __init__(
        self, machine: DeliveryMachine, task: Any, task_id: str, header: Any, redelivered: bool
    ) -> None:
        self.machine = machine
        self.task, self.name, self.id = task, task.name, task_id
        self.request_dict: dict[str, Any] = {"retries": 0}
        if header is not None:
            self.request_dict[HEADER] = header
        self.args: list[Any] = []
        self.kwargs: dict[str, Any] = {}
        self.delivery_info: dict[str, Any] = {"redelivered": True} if redelivered else {}
        self.expires = None
        self.time_start: float | None = None

    def revoked(self) -> bool:
        return self.machine.discard_if_revoked(self)

    def on_success(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_failure(self, exc_info: Any, *args: Any, **kwargs: Any) -> None:
        pass


@dataclass(eq=False)
class Node:
    index: int
    consumer: StoppedConsumer
    gate: Gate
    #: releases in this process reach the gate directly (else through its wake lists)
    local: bool
    up: bool = True
    pool: list[Delivery] = field(default_factory=list)  # dispatched, not started

    def __repr__(self) -> str:
        return f"node{self.index}"


@dataclass(eq=False)
class Delivery:
    n: int
    task_id: str
    node: Node
    req: ModelRequest
    #: a copy of an execution (redelivered, parked, woken): may be dropped as a duplicate
    copy: bool
    where: str = "gate"  # gate | pool | running | done
    outcome: str = ""
    fail: bool = False
    entered: bool = False
    parked: int = 0
    info: Any = None
    error: BaseException | None = None
    thread: threading.Thread | None = None
    settled: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)

    @property
    def ticket(self) -> str:
        return f"{self.task_id}:0"

    @property
    def claim(self) -> str | None:
        raw = self.req.request_dict.get(CLAIM_KEY)
        return str(raw["c"]) if isinstance(raw, dict) else None

    def __repr__(self) -> str:
        return (
            f"d{self.n}({self.task_id[:6]}@{self.node}, {self.where}"
            f"{', ' + self.outcome if self.outcome else ''})"
        )


_running = threading.local()  # the delivery whose body this pool thread runs


class DeliveryMachine(RuleBasedStateMachine):
    redis_server: RedisServer
    clock: Clock

    def __init__(self) -> None:
        super().__init__()
        self.stack = ExitStack()
        self.app: Celery = self.stack.enter_context(gate_app(self.redis_server, "delivery-model"))
        self.client: Any = self.redis_server.client(0)
        self.stack.callback(self.client.close)
        self.lock = threading.Lock()
        self.broker = Broker()
        self.late = Late()
        self.nodes: list[Node] = []
        self.deliveries: list[Delivery] = []
        self.by_req: dict[int, Delivery] = {}
        self.sends: Counter[str] = Counter()
        self.runs: Counter[str] = Counter()
        self.revoked: set[str] = set()
        self.inside: Counter[str] = Counter()  # task id -> bodies inside now
        self.blockers: list[str] = []  # units held "in another process"
        self.blocker_n = 0
        self.broken: list[str] = []
        self.advanced = 0.0
        self.steps_ok = True
        self.trail: list[str] = []  # what happened, for a failure's message
        self.limit = 0
        self.hold = 0
        self.ready = False

    # -- setup --------------------------------------------------------------------------------

    @initialize(
        limit=st.sampled_from([1, 2]),
        hold=st.sampled_from([10, 1]),
        local=st.tuples(st.booleans(), st.booleans()),
        nodes=st.sampled_from([2, 1]),
    )
    def configure(self, limit: int, hold: int, local: tuple[bool, bool], nodes: int) -> None:
        self.limit, self.hold = limit, hold
        machine = self

        # shared=False: not on other apps
        @self.app.task(
            bind=True, base=ModelTask, name="delivery_model.job", shared=False, ignore_result=True
        )
        @limited("main", limit=limit, lease_ttl=LEASE, slot_wait_timeout=0, max_wait=MAX_WAIT)
        def job(self: Any) -> None:
            machine.body(self.request.id)

        self.job = job
        job.broker = self.broker
        self.trace = build_tracer(job.name, job, app=self.app)
        self.sem = semaphore_for(self.app, "main", limit, LEASE)
        # its sweep (a reclaim about once a second, which wakes waiters) is the rule sweep
        heartbeat.unwatch(self.sem)
        # the same semaphore "in another process", whose wake-ups and handoffs arrive late
        self.elsewhere = Semaphore(
            "main",
            limit,
            redis=self.client,
            lease_ttl=LEASE,
            key_prefix=str(self.app.conf.semaphore_key_prefix),
            on_wake=self.late.on_wake,
            on_handoff=self.late.on_handoff,
        )
        self.router = wakes.WakeRouter(self.app, "main")
        for i in range(nodes):
            self._new_node(local[i])
        self.ready = True

    def _new_node(self, local: bool) -> Node:
        consumer = StoppedConsumer(self.app)
        node_box: list[Node] = []

        def _process_task(req: Any) -> None:  # the consumer's own dispatch to the pool
            self.to_pool(node_box[0], req)

        gate = Gate(consumer, _process_task, hold=self.hold)
        node = Node(len(self.nodes), consumer, gate, local)
        node_box.append(node)
        if local:
            wakes.register(gate.key, gate)
            wakes.register(gate.handoff_key, gate)
        self.nodes.append(node)
        return node

    # -- what the worker does around the gate -------------------------------------------------

    def to_pool(self, node: Node, req: Any) -> None:
        """Celery's ``_process_task``: ``execute_using_pool`` discards a revoked request."""
        d = self.by_req[id(req)]
        if req.revoked():
            return
        if d.where != "gate":
            # e.g. by the hub of a stopped node, after its message was delivered again
            directive = req.request_dict.get(GATE_HEADER) or {}
            if (
                TOLERATE_TIMEOUT_AFTER_STOP
                and d.outcome == "delivered again"
                and directive.get("do") == "timeout"
            ):
                self.say(f"{d}: its timeout dispatched after the stop (TOLERATE_TIMEOUT...)")
                return
            self.broken.append(f"{d} dispatched to the pool at {node}, not from its gate")
            return
        d.where = "pool"
        node.pool.append(d)

    def discard_if_revoked(self, req: ModelRequest) -> bool:
        if req.id not in self.revoked:
            return False
        d = self.by_req[id(req)]
        if d.where in ("gate", "pool"):
            d.where, d.outcome = "done", "revoked"
            worker_state.task_ready(req)
            self.say(f"revoked {d}")
        return True

    def deliver(self, node: Node, task_id: str, header: Any, redelivered: bool, copy: bool) -> None:
        req = ModelRequest(self, self.job, task_id, header, redelivered)
        d = Delivery(len(self.deliveries), task_id, node, req, copy)
        self.deliveries.append(d)
        self.by_req[id(req)] = d
        self.say(f"deliver {d} redelivered={redelivered} header={header}")
        worker_state.task_reserved(req)  # what Celery's strategy does before on_task_request
        node.gate.on_task_request(req)

    def body(self, task_id: str) -> None:
        """The task body: counts itself in and out, never asking the semaphore."""
        d: Delivery = _running.delivery
        with self.lock:
            self.inside[task_id] += 1
            self.runs[task_id] += 1
            d.entered = True
            total = sum(self.inside.values()) + len(self.blockers)
            if total > self.limit:
                self.broken.append(f"{total} inside at once (limit {self.limit}), with {d}")
            if self.inside[task_id] > 1:
                self.broken.append(f"two bodies of task {task_id} inside at once, with {d}")
        d.settled.set()
        d.go.wait(SETTLE * 3)
        with self.lock:
            self.inside[task_id] -= 1
        if d.fail:
            raise RuntimeError("the body failed")

    def _pool_thread(self, d: Delivery) -> None:
        _running.delivery = d
        req = d.req
        request: dict[str, Any] = {
            "id": req.id,
            "retries": 0,
            "hostname": d.node.consumer.hostname,
            "delivery_info": dict(req.delivery_info),
            "headers": {},
            "task": self.job.name,
        }
        for key in (CLAIM_KEY, QUEUE_KEY, GATE_HEADER, HEADER):
            if key in req.request_dict:
                request[key] = req.request_dict[key]
        me = threading.get_ident()
        try:
            _, d.info, _, _ = self.trace(req.id, [], {}, request)
        except BaseException as exc:
            d.error = exc
        finally:
            with self.broker.lock:
                d.parked = self.broker.published_by.pop(me, 0)
            worker_state.task_ready(req)
            d.settled.set()

    def start_body(self, d: Delivery) -> None:
        d.node.pool.remove(d)
        d.where = "running"
        d.req.time_start = time.time()
        d.thread = threading.Thread(target=self._pool_thread, args=(d,), daemon=True)
        d.thread.start()
        if not d.settled.wait(SETTLE):
            self.broken.append(f"the body of {d} neither started nor ended")
            return
        if not d.entered:
            d.thread.join(SETTLE)
            self._ended(d)

    def finish_body(self, d: Delivery, fail: bool) -> None:
        d.fail = fail
        d.go.set()
        assert d.thread is not None
        d.thread.join(SETTLE)
        if d.thread.is_alive():
            self.broken.append(f"the body of {d} did not end")
            return
        self._ended(d)

    def _ended(self, d: Delivery) -> None:
        d.where = "done"
        info = d.info
        if d.entered:
            d.outcome = "failed" if d.fail else "ran"
        elif d.error is not None:
            d.outcome = f"error {d.error!r}"
        elif info is not None and info.state == states.IGNORED:
            d.outcome = "parked" if d.parked else "dropped"
        elif (
            info is not None
            and info.state == states.FAILURE
            and isinstance(info.retval, SemaphoreTimeout)
        ):
            d.outcome = "timed out"
        else:
            state = None if info is None else (info.state, info.retval)
            d.outcome = f"error {state!r}"
        if d.outcome.startswith("error") or (d.parked and d.outcome != "parked"):
            self.broken.append(f"{d}: unexpected end of its body ({d.parked} parked copies)")
        self.say(f"ended {d}")

    def first_attempt(self, node: Node) -> bool:
        """One pass of the gate's arrivals thread: the first try of the oldest arrival."""
        gate = node.gate
        with gate.arrivals.cond:
            entry = gate.arrivals.queue.popleft() if gate.arrivals.queue else None
        if entry is None:
            return False
        gate.attempts.attempt(entry, first=True)
        return True

    def run_hub(self, node: Node) -> bool:
        soon, node.consumer.soon[:] = list(node.consumer.soon), []
        for fn, args in soon:
            fn(*args)
        return bool(soon)

    def take_wake(self, node: Node, handoffs_first: bool) -> str | None:
        gate = node.gate
        keys = (gate.handoff_key, gate.key) if handoffs_first else (gate.key, gate.handoff_key)
        for key in keys:
            raw = self.client.lpop(key)
            if raw is not None:
                return raw.decode() if isinstance(raw, bytes) else str(raw)
        return None

    def give_wake(self, node: Node, item: str) -> None:
        """What the gate thread does with an item of its wake lists."""
        found = wakes.parse(item)
        if isinstance(found, wakes.Handoff):
            node.gate.handed(found.ticket, found.fence, found.expires_at, found.claim)
        elif isinstance(found, wakes.Wake):
            node.gate.wake(found.ticket)

    def give_late(self, index: int) -> None:
        ticket, data, handoff = self.late.items.pop(index)
        if handoff is None:
            self.router(ticket, data)
        else:
            self.router.handoff(ticket, data, *handoff)

    def stop_node(self, node: Node) -> None:
        """The worker stops: its gate stops, its pool ends the work it was given, and every
        message it had not acknowledged is delivered again.  Its hub may still run the
        callbacks it had (rule ``hub``): the gate must have made them harmless."""
        node.gate.stop()
        node.up = False
        others = [n for n in self.nodes if n.up]
        for d in [d for d in self.deliveries if d.node is node and d.where == "gate"]:
            d.where, d.outcome = "done", "delivered again"
            worker_state.task_ready(d.req)
            if others:
                header = d.req.request_dict.get(HEADER)
                self.deliver(others[d.n % len(others)], d.task_id, header, True, True)
            else:
                self.broken.append(f"{d}: no node left to deliver it again")

    def live(self) -> list[Node]:
        return [n for n in self.nodes if n.up]

    def running(self) -> list[Delivery]:
        return [d for d in self.deliveries if d.where == "running" and d.entered]

    def advance(self, seconds: float, *, wall: bool = True) -> None:
        """Let ``seconds`` pass for the gate's ticks (and, with ``wall``, for max_wait)."""
        self.clock.offset += seconds
        if wall:
            self.clock.wall_offset += seconds
            self.advanced += seconds

    # -- rules -------------------------------------------------------------------------------

    def _step(self) -> None:
        self.steps_ok = False
        caller = sys._getframe(1)
        args = {k: v for k, v in caller.f_locals.items() if k != "self"}
        self.trail.append(f"{caller.f_code.co_name}({args})")

    #: False when a test plays a fixed sequence (outside Hypothesis: no notes)
    noting = True

    def say(self, what: str) -> None:
        if self.noting:
            note(what)
        self.trail.append("    " + what)

    def story(self) -> str:
        return "\n".join(["", *self.trail[-150:]])

    def _done(self) -> None:
        self.steps_ok = True

    @precondition(lambda self: self.ready and len(self.sends) < MAX_SENDS)
    @rule(node=PICK)
    def send(self, node: int) -> None:
        self._step()
        live = self.live()
        task_id = str(uuid.uuid4())
        self.sends[task_id] += 1
        self.deliver(live[node % len(live)], task_id, None, False, False)
        self._done()

    @precondition(lambda self: self.ready and 0 < sum(self.sends.values()) < 2 * MAX_SENDS)
    @rule(which=PICK, node=PICK)
    def send_again(self, which: int, node: int) -> None:
        """A second message with a task id already sent (a user's deduplicating id)."""
        self._step()
        ids = list(self.sends)  # in the order sent: task ids are random
        task_id = ids[which % len(ids)]
        self.sends[task_id] += 1
        live = self.live()
        self.deliver(live[node % len(live)], task_id, None, False, False)
        self._done()

    @precondition(
        lambda self: (
            self.ready
            and len(self.deliveries) < 6 * MAX_SENDS
            and any(d.entered and not d.copy for d in self.deliveries)
        )
    )
    @rule(which=PICK, node=PICK)
    def redeliver(self, which: int, node: int) -> None:
        """The broker delivers again a message whose body runs or ran (a lost connection, a
        visibility timeout)."""
        self._step()
        ran = [d for d in self.deliveries if d.entered and not d.copy]
        d = ran[which % len(ran)]
        live = self.live()
        self.deliver(live[node % len(live)], d.task_id, None, True, True)
        self._done()

    @precondition(lambda self: self.ready and bool(self.broker.messages))
    @rule(which=PICK, node=PICK)
    def deliver_copy(self, which: int, node: int) -> None:
        """The broker delivers a copy a body or a release published (parked, woken)."""
        self._step()
        task_id, header = self.broker.messages.pop(which % len(self.broker.messages))
        live = self.live()
        self.deliver(live[node % len(live)], task_id, header, False, True)
        self._done()

    @precondition(lambda self: self.ready)
    @rule(node=PICK)
    def arrivals(self, node: int) -> None:
        self._step()
        live = self.live()
        self.first_attempt(live[node % len(live)])
        self._done()

    @precondition(lambda self: self.ready and any(n.consumer.soon for n in self.nodes))
    @rule(node=PICK)
    def hub(self, node: int) -> None:
        self._step()
        busy = [n for n in self.nodes if n.consumer.soon]
        self.run_hub(busy[node % len(busy)])
        self._done()

    @precondition(lambda self: self.ready and any(n.pool for n in self.nodes))
    @rule(which=PICK)
    def pool_starts(self, which: int) -> None:
        self._step()
        waiting = [d for n in self.nodes for d in n.pool]
        self.start_body(waiting[which % len(waiting)])
        self._done()

    @precondition(lambda self: self.ready and bool(self.running()))
    @rule(which=PICK, fail=st.booleans())
    def body_ends(self, which: int, fail: bool) -> None:
        self._step()
        running = self.running()
        self.finish_body(running[which % len(running)], fail)
        self._done()

    @precondition(lambda self: self.ready)
    @rule(node=PICK, handoffs_first=st.booleans(), lose=st.booleans())
    def wake_list(self, node: int, handoffs_first: bool, lose: bool) -> None:
        """The gate thread takes one item of its wake lists (or it is lost)."""
        self._step()
        live = self.live()
        n = live[node % len(live)]
        item = self.take_wake(n, handoffs_first)
        self.say(f"{'lost' if lose else 'delivered'} {item!r} at {n}")
        if item is not None and not lose:
            self.give_wake(n, item)
        self._done()

    @precondition(lambda self: self.ready and len(self.blockers) < self.limit)
    @rule()
    def outside_takes(self) -> None:
        """Another process takes a unit (no place in line)."""
        self._step()
        self.blocker_n += 1
        ticket = f"outside-{self.blocker_n}"
        if self.elsewhere.try_acquire(ticket).permit is not None:
            with self.lock:
                self.blockers.append(ticket)
                if sum(self.inside.values()) + len(self.blockers) > self.limit:
                    self.broken.append(f"{ticket} granted over the limit")
        self._done()

    @precondition(lambda self: self.ready and bool(self.blockers))
    @rule(handoff=st.booleans())
    def outside_releases(self, handoff: bool) -> None:
        """Its release's wake-ups and handoffs go to ``late``; ``handoff=False``: it hands
        nothing off, it only names the waiters (a script's or the CLI's release)."""
        self._step()
        ticket = self.blockers.pop(0)
        assert self.elsewhere.release_token(ticket, handoff=handoff)
        self._done()

    @precondition(lambda self: self.ready and bool(self.late.items))
    @rule(which=PICK, lose=st.booleans())
    def late_item(self, which: int, lose: bool) -> None:
        """A wake-up or handoff from the other process arrives now (or never)."""
        self._step()
        index = which % len(self.late.items)
        if lose:
            self.say(f"lost {self.late.items.pop(index)}")
        else:
            self.give_late(index)
        self._done()

    @precondition(lambda self: self.ready)
    @rule(node=PICK, seconds=st.sampled_from([0.0, REFRESH, REFRESH, HOLD, MAX_WAIT + 1]))
    def tick(self, node: int, seconds: float) -> None:
        self._step()
        if self.advanced + seconds <= BUDGET:
            self.advance(seconds)
        live = self.live()
        live[node % len(live)].gate.upkeep.tick()
        self._done()

    @precondition(lambda self: self.ready)
    @rule()
    def sweep(self) -> None:
        """The heartbeat's sweep: take back expired leases and wake whom free units belong to."""
        self._step()
        self.sem.reclaim()
        self._done()

    @precondition(lambda self: self.ready and bool(self.sends))
    @rule(which=PICK)
    def revoke(self, which: int) -> None:
        self._step()
        ids = list(self.sends)  # in the order sent: task ids are random
        task_id = ids[which % len(ids)]
        self.revoked.add(task_id)
        worker_state.revoked.add(task_id)
        self._done()

    @precondition(lambda self: self.ready and len(self.live()) > 1)
    @rule(node=PICK)
    def stop(self, node: int) -> None:
        self._step()
        live = self.live()
        self.stop_node(live[node % len(live)])
        self._done()

    @precondition(lambda self: self.ready and len(self.live()) < 2 and len(self.nodes) < MAX_NODES)
    @rule(local=st.booleans())
    def start_node(self, local: bool) -> None:
        self._step()
        self._new_node(local)
        self._done()

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def nothing_broken(self) -> None:
        assert self.broken == [], "\n".join(self.broken) + self.story()

    @invariant()
    def within_the_limit(self) -> None:
        if not self.ready:
            return
        used = int(self.client.hget(self.sem.keys.state, "used") or 0)
        self.check(used <= self.limit, f"used {used} in Redis (limit {self.limit})")

    @invariant()
    def every_body_inside_holds_its_permit(self) -> None:
        """A body runs only while its delivery's permit is held (under its own claim)."""
        running = self.running() if self.ready else []
        if not running:
            return
        held = {(h.token, h.owner.get("claim")) for h in self.elsewhere.holders()}
        for d in running:
            self.check((d.ticket, d.claim) in held, f"{d} runs without its permit: {held}")

    def check(self, ok: bool, problem: str) -> None:
        if not ok:
            self.steps_ok = False  # the end is not checked after a failure
            raise AssertionError(problem + self.story())

    # -- the end -------------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            if self.ready and self.steps_ok and not self.broken:
                self.drain()
                self.check_the_end()
        finally:
            self.cleanup()

    def in_flight(self) -> list[str]:
        left = [repr(d) for d in self.deliveries if d.where != "done"]
        left += [f"message {m[0][:6]}" for m in self.broker.messages]
        left += [f"late {item[0][:6]}" for item in self.late.items]
        left += [f"hub of {n}" for n in self.nodes if n.consumer.soon]
        left += [f"held at {n}: {n.gate.held()}" for n in self.live() if n.gate.held()]
        for n in self.live():
            for key in (n.gate.key, n.gate.handoff_key):
                if self.client.llen(key):
                    left.append(f"wake list of {n}")
        if self.blockers:
            left.append("outside units")
        return left

    def drain(self) -> None:
        """Drive everything to its end: every step the worker would take, bounded."""
        for _ in range(DRAIN_ROUNDS):
            while self.blockers:
                self.elsewhere.release_token(self.blockers.pop(0))
            while self.late.items:
                self.give_late(0)
            for node in self.nodes:
                for _ in range(100):
                    item = self.take_wake(node, True)
                    if item is None:
                        break
                    if node.up:  # nobody reads a stopped gate's lists
                        self.give_wake(node, item)
            for node in self.live():
                for _ in range(100):
                    if not self.first_attempt(node):
                        break
            for node in self.nodes:
                self.run_hub(node)
            for d in self.running():
                self.finish_body(d, d.n % 4 == 3)
            for node in self.nodes:
                for d in list(node.pool):
                    self.start_body(d)
                    if d.entered:
                        self.finish_body(d, d.n % 4 == 3)
            while self.broker.messages:
                task_id, header = self.broker.messages.pop(0)
                live = self.live()
                self.deliver(live[len(self.deliveries) % len(live)], task_id, header, False, True)
            assert self.broken == [], "\n".join(self.broken) + self.story()
            self.expire_known_leaks()
            if not self.in_flight():
                break
            self.advance(REFRESH, wall=False)  # no task times out while the test drains
            for node in self.live():
                node.gate.upkeep.tick()
        # a last tick forgets the grants whose bodies ended
        for node in self.live():
            node.gate.upkeep.tick()

    def expire_known_leaks(self) -> None:
        """Expire the places of the known defects (see TOLERATE_DONE_PLACES and
        TOLERATE_REVOKED_PLACES): no delivery of their task is left, and their ticket is done,
        or their task revoked.  The next call to Redis takes them back, as time would."""
        alive = {d.task_id for d in self.deliveries if d.where != "done"}
        alive |= {m[0] for m in self.broker.messages}
        for w in self.elsewhere.waiters():
            task_id = w.ticket.rpartition(":")[0]
            if task_id in alive or self.client.hexists(self.sem.keys.state, "h:" + w.ticket):
                continue
            done = any(
                self.client.zscore(self.sem.keys.expiry, kind + w.ticket) is not None
                for kind in ("h:", "d:")
            )
            if done and TOLERATE_DONE_PLACES:
                why = "its ticket done (TOLERATE_DONE_PLACES)"
            elif task_id in self.revoked and TOLERATE_REVOKED_PLACES:
                why = "its task revoked (TOLERATE_REVOKED_PLACES)"
            else:
                continue
            self.say(f"expired the place of {w.ticket[:6]}, {why}")
            self.client.zadd(self.sem.keys.expiry, {"w:" + w.ticket: 0}, xx=True)
            self.sem.reclaim()

    def check_the_end(self) -> None:
        problems = [f"not ended after {DRAIN_ROUNDS} rounds: {x}" for x in self.in_flight()]
        ends = Counter(d.outcome for d in self.deliveries)
        self.say(f"ends: {dict(ends)}; runs: {dict(self.runs)}; sends: {dict(self.sends)}")
        for task_id, sent in self.sends.items():
            ran = self.runs[task_id]
            mine = [d for d in self.deliveries if d.task_id == task_id]
            if task_id in self.revoked or any(d.outcome == "timed out" for d in mine):
                if ran > sent:
                    problems.append(f"task {task_id} sent {sent} times ran {ran}: {mine}")
            elif sent == 1 and ran != 1:
                problems.append(f"task {task_id} sent once ran {ran} times: {mine}")
            elif not 1 <= ran <= sent:
                problems.append(f"task {task_id} sent {sent} times ran {ran}: {mine}")
        allowed = {"ran", "failed", "dropped", "parked", "revoked", "delivered again", "timed out"}
        problems += [f"{d} ended oddly" for d in self.deliveries if d.outcome not in allowed]
        hosts = {n.consumer.hostname: repr(n) for n in self.nodes}
        for h in self.elsewhere.holders():
            problems.append(f"permit left held: {h.token} at {hosts.get(str(h.owner.get('host')))}")
        for w in self.elsewhere.waiters():
            where = hosts.get(str(w.owner.get("host")))
            problems.append(f"place left in line: {w.ticket} at {where}, {w}")
        for node in self.nodes:
            if node.gate.held():
                problems.append(f"{node} still holds {node.gate.held()}")
        assert problems == [], "\n".join(problems) + self.story()

    def cleanup(self) -> None:
        for d in self.deliveries:
            d.go.set()
        for d in self.deliveries:
            if d.thread is not None:
                d.thread.join(SETTLE)
        for node in self.nodes:
            if node.up:
                node.gate.stop()
            wakes.unregister(node.gate.key)
            wakes.unregister(node.gate.handoff_key)
        for d in self.deliveries:
            worker_state.task_ready(d.req)
        for task_id in self.revoked:
            worker_state.revoked.discard(task_id)
        if self.ready:
            heartbeat.unwatch(self.sem)  # its keys go next: its sweep would find its state lost
        self.stack.close()


def _patch_time(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(clock_module, "mod_time", clock)
    # the heartbeat thread (lease refreshes, which wake waiters) and the semaphore cache keep
    # real time: nothing in the background acts on the time the test makes pass
    real = SimpleNamespace(monotonic=time.monotonic, sleep=time.sleep)
    monkeypatch.setattr(heartbeat_module, "clock", real)
    monkeypatch.setattr(locks_module, "clock", real)
    # time.time(): the wait so far
    for module in (
        gate_dispatch_module,
        gate_upkeep_module,
        gated_module,
        park_module,
        hold_module,
        wait_state_module,
    ):
        monkeypatch.setattr(module, "time", SimpleNamespace(time=clock.time))
    return clock


def test_deliveries_through_gates_match_the_model(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    DeliveryMachine.redis_server = redis_server
    DeliveryMachine.clock = _patch_time(monkeypatch)
    run_state_machine_as_test(
        DeliveryMachine,
        settings=settings(
            max_examples=50,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
            # the same examples in every run: CI checks what was checked here (a wider search
            # runs with derandomize off, by hand); the sequences it found are played below
            derandomize=True,
            database=None,
        ),
    )


#: sequences the random search found failing (each a defect since fixed), played every run
FOUND: dict[str, list[tuple[str, dict[str, Any]]]] = {
    # a task id sent again while its first message ran: the second parks, and its parked copy
    # found the first's tombstone, dropped itself, and left its place at the head of the line
    "reused-id-parks": [
        ("send", {"node": 0}),
        ("send", {"node": 0}),
        ("send_again", {"node": 1, "which": 0}),
    ],
    # a task held too long parks; revoked while the park waits for the hub: its place stayed
    "revoked-on-its-way-to-park": [
        ("outside_takes", {}),
        ("send", {"node": 0}),
        ("arrivals", {"node": 0}),
        ("tick", {"node": 0, "seconds": 901.0}),
        ("revoke", {"which": 0}),
    ],
    # a second message with the id of a task granted but not yet in the pool: the second
    # finished first, and the gate, reading "done" from the task id, forgot the first's
    # grant: it was never released once the first was revoked
    "same-id-ends-first-then-revoke": [
        ("send", {"node": 0}),
        ("arrivals", {"node": 0}),
        ("send_again", {"node": 0, "which": 0}),
        ("pool_starts", {"which": 0}),
        ("tick", {"node": 0, "seconds": 0.0}),
        ("revoke", {"which": 0}),
    ],
    # ... and, the same way, was handed to the pool after the gate stopped
    "same-id-ends-first-then-stop": [
        ("send", {"node": 0}),
        ("arrivals", {"node": 0}),
        ("send_again", {"node": 0, "which": 0}),
        ("pool_starts", {"which": 0}),
        ("tick", {"node": 0, "seconds": 0.0}),
        ("stop", {"node": 0}),
        ("hub", {"node": 0}),
    ],
    # a timeout on its way to the pool when the gate stopped was still handed to the pool,
    # while the unacknowledged message was delivered again
    "timeout-after-stop": [
        ("outside_takes", {}),
        ("send", {"node": 0}),
        ("arrivals", {"node": 0}),
        ("tick", {"node": 0, "seconds": 951.0}),
        ("stop", {"node": 0}),
        ("hub", {"node": 0}),
    ],
}


@pytest.mark.parametrize("name", sorted(FOUND))
def test_a_sequence_the_model_found(
    name: str, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    DeliveryMachine.redis_server = redis_server
    DeliveryMachine.clock = _patch_time(monkeypatch)
    machine = DeliveryMachine()
    machine.noting = False
    try:
        machine.configure(limit=1, hold=10, local=(False, False), nodes=2)
        steps: list[tuple[str, dict[str, Any]]] = FOUND[name]
        for step, kwargs in steps:
            getattr(machine, step)(**kwargs)
            machine.nothing_broken()
            machine.within_the_limit()
            machine.every_body_inside_holds_its_permit()
    finally:
        machine.teardown()
