"""A delivery of a limited task: one message reaching one worker, and what travels with it.

Several deliveries of one execution (ticket ``<task id>:<retries>``) can exist at once: the
message held by a worker's gate, a copy parked with a countdown, a copy woken by a release, a
redelivery after a lost worker or a ``visibility_timeout``, a second message reusing the task
id.  Each delivery has its own **claim**, given by the worker's consumer as it receives the
message (:func:`stamp_claim`), and every Redis call made for it carries that claim (see the
invariant in :mod:`celery_semaphore.integration.body`).

The request keys below travel from the consumer to the body in the request itself, never as
message headers (the consumer overwrites whatever a message brought).  The wait state a parked
copy carries in its message is in :mod:`.wait_state`.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeGuard

from . import queues

__all__ = [
    "CLAIM_KEY",
    "HOLDING",
    "TRANSITIONS",
    "Delivery",
    "Directive",
    "IllegalMove",
    "Stage",
    "GATE_HEADER",
    "QUEUE_KEY",
    "delivery_claim",
    "from_this_worker",
    "gate_nonce",
    "handled_here",
    "host_owner",
    "note_handled",
    "stamp_claim",
    "stamp_delivery",
    "stamped_claim",
    "task_id_of",
    "ticket_of",
]

#: the request key in which the worker's consumer tells the body which queue the message came
#: from (it knows the AMQP consumer tag; a pool process does not); never a message header
QUEUE_KEY = "semaphore_queue"

#: the request key in which the worker-side gate hands its grant to the body (never a message
#: header: the gate strips it from incoming messages)
GATE_HEADER = "semaphore_gate"

#: the request key in which the worker's consumer gives each delivery of a limited task its
#: claim (``{"n": <worker nonce>, "c": <claim>}``): every Redis call made for that delivery,
#: in the pool or in the consumer, carries it; never a message header (the consumer stamps
#: it on every limited request, over anything a message brought)
CLAIM_KEY = "semaphore_claim"

_handled_lock = threading.Lock()

_handled: OrderedDict[str, None] = OrderedDict()


def note_handled(token: str) -> None:
    """Record that this process ran ``token``'s body (and so released it itself)."""
    with _handled_lock:
        _handled[token] = None
        while len(_handled) > 10_000:
            _handled.popitem(last=False)


def handled_here(token: str) -> bool:
    with _handled_lock:
        return token in _handled


_nonce: str | None = None


def gate_nonce() -> str:
    """This worker's gate nonce: made once in the worker's main process, before the pool
    forks, so its children share it; a grant is trusted only with this nonce."""
    global _nonce
    if _nonce is None:
        _nonce = uuid.uuid4().hex
    return _nonce


def host_owner(task_id: str | None, task: str, host: str) -> dict[str, Any]:
    """The owner metadata of a permit or place: the task, and where it runs (the machine and
    its PID namespace, so a process is judged dead only by a host that can see it)."""
    pid, machine, pidns = _where()
    return {
        "task_id": task_id,
        "task": task,
        "host": host,
        "pid": pid,
        "machine": machine,
        "pidns": pidns,
    }


#: (pid, machine, PID namespace) of this process, worked out once per process: a forked child
#: (its own pid) works it out again
_here: tuple[int, str, str] | None = None


def _where() -> tuple[int, str, str]:
    global _here
    pid = os.getpid()
    here = _here
    if here is None or here[0] != pid:
        here = _here = (pid, socket.gethostname(), _pid_namespace())
    return here


def _pid_namespace() -> str:
    """This process's PID namespace ('pid:[4026531836]'), '' where /proc does not say."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def delivery_claim(request: Any) -> str:
    """The claim of the delivery ``request`` belongs to: the one the consumer stamped, else
    (outside a worker: eager, direct calls) a new one."""
    return stamped_claim(request) or uuid.uuid4().hex


def ticket_of(task_id: str | None, retries: int | None) -> str:
    """The ticket of an execution: ``<task id>:<retries>``.  Waits keep ``retries``, so every
    copy of an execution shares it; the user's own ``self.retry()`` is a new execution."""
    return f"{task_id}:{retries or 0}"


def task_id_of(ticket: str) -> str:
    """The task id in ``ticket`` (for logs)."""
    return ticket.rpartition(":")[0]


def stamp_claim(request_dict: dict[str, Any]) -> str:
    """Give a delivery its claim, in the consumer as it receives the message (over anything
    the message brought); returns it."""
    claim = uuid.uuid4().hex
    request_dict[CLAIM_KEY] = {"n": gate_nonce(), "c": claim}
    return claim


def stamp_delivery(req: Any, app: Any, consumer: Any) -> None:
    """Stamp a limited request as this delivery's: its claim (see :data:`CLAIM_KEY`), over
    anything the message brought, and the queue it was delivered from (see
    :data:`QUEUE_KEY`: only the consumer can map the message's AMQP consumer tag to its
    queue)."""
    stamp_claim(req.request_dict)
    message = getattr(req, "message", None)
    info = getattr(message, "delivery_info", None) or req.delivery_info
    req.request_dict[QUEUE_KEY] = queues.delivery_queue(app, info, consumer) or ""


def from_this_worker(raw: Any) -> TypeGuard[Mapping[str, Any]]:
    """Was ``raw`` (a claim stamp, or the gate's directive) made by this worker?  Only such a
    value counts: a message may carry anything."""
    return isinstance(raw, Mapping) and _nonce is not None and raw.get("n") == _nonce


def stamped_claim(request: Any) -> str | None:
    """The claim this worker's consumer stamped on ``request`` (a task's request context, or
    the worker's ``Request``; see :data:`CLAIM_KEY`), or None: not stamped, or stamped by
    another worker."""
    raw = getattr(request, CLAIM_KEY, None)
    if raw is None:
        raw = (getattr(request, "request_dict", None) or {}).get(CLAIM_KEY)
    if from_this_worker(raw):
        claim = raw.get("c")
        if isinstance(claim, str) and claim:
            return claim
    return None


@dataclass(frozen=True)
class Directive:
    """What a worker's gate decided for a delivery it held, handed to the body in the request
    (:data:`GATE_HEADER`, never a message header): ``run`` with the grant it made
    (``fencing``, one token per semaphore; ``expires_at``, server seconds), ``park`` (held too
    long: re-publish with a countdown, keeping the place, under the same ``claim``),
    ``standby`` (near the head of the line: wait in the slot on the list ``wake``, where the
    release that frees the units grants them, under the same ``claim``) or ``timeout`` (past
    ``max_wait``: fail with SemaphoreTimeout) or ``fail`` (what the call asks for could not be
    worked out: fail with SemaphoreRequestError, whose message is ``error``).  ``partition``:
    the line the execution waits in; ``waited``: seconds since it first asked; ``granted_at``:
    when the grant was made, on the machine's monotonic clock (the same in every process of it);
    ``plan``: the call's targets as the gate resolved them (see ``targets.Plan.to_wire``), so
    the body does not resolve them again."""

    nonce: str
    ticket: str
    claim: str
    do: str
    partition: str
    fencing: tuple[int, ...] = ()
    expires_at: float = 0.0
    waited: float = 0.0
    granted_at: float = 0.0
    plan: Mapping[str, Any] | None = None
    wake: str = ""
    error: str = ""

    def to_request(self) -> dict[str, Any]:
        """The plain value that travels in the request (to a prefork child too)."""
        return {
            "nonce": self.nonce,
            "ticket": self.ticket,
            "claim": self.claim,
            "do": self.do,
            "partition": self.partition,
            "fencing": list(self.fencing),
            "expires_at": self.expires_at,
            "waited": self.waited,
            "granted_at": self.granted_at,
            "plan": self.plan,
            "wake": self.wake,
            "error": self.error,
        }

    @classmethod
    def from_request(cls, request: Any) -> Directive | None:
        """The directive on ``request`` (a task's request context), if this worker's gate
        made it for this very execution; None otherwise (a message may carry anything)."""
        raw = getattr(request, GATE_HEADER, None)
        if not isinstance(raw, Mapping) or raw.get("nonce") != _nonce or _nonce is None:
            return None
        if raw.get("ticket") != ticket_of(request.id, request.retries):
            return None
        try:
            return cls(
                nonce=str(raw["nonce"]),
                ticket=str(raw["ticket"]),
                claim=str(raw["claim"]),
                do=str(raw["do"]),
                partition=str(raw["partition"]),
                fencing=tuple(int(f) for f in raw["fencing"]),
                expires_at=float(raw["expires_at"]),
                waited=float(raw["waited"]),
                granted_at=float(raw["granted_at"]),
                plan=raw["plan"] if isinstance(raw.get("plan"), Mapping) else None,
                wake=str(raw.get("wake") or ""),
                error=str(raw.get("error") or ""),
            )
        except (KeyError, TypeError, ValueError):
            return None


# -- a delivery's life in a worker's gate ---------------------------------------------------


class Stage(Enum):
    """Where a delivery held by a worker's gate is in its life (see :data:`TRANSITIONS`)::

        RECEIVED ──► HELD ──► GRANTED ──► RUNNING ──► DONE (its request is done, or it was
           │           │         │          │             revoked before it started, or
           │           │         │          │             the pool refused it)
           │           │         │          ╰──► GIVEN_BACK (the pool stopped without
           │           │         │                          starting it)
           │           │         ╰──► GIVEN_BACK (the worker stopped first)
           ├───────────┴──► HANDED_OVER (slot, park, standby) ─┬─► GIVEN_BACK (the worker stopped
           ├───────────┴──► TIMED_OUT ──────────────────────────┘    before the pool took it)
           ├───────────┴──► REVOKED
           ╰───────────┴──► GIVEN_BACK (the worker stopped)

    Every way out of RECEIVED and HELD either hands the place over with the delivery's claim
    (GRANTED: with its grant; HANDED_OVER: the body acquires under the same claim) or
    withdraws the place in the same step, giving back a grant a release made meanwhile
    (TIMED_OUT, REVOKED, GIVEN_BACK)."""

    #: taken from the broker; its first attempt is not made yet (or failed)
    RECEIVED = "received"
    #: waiting in line, held by the gate off the pool (unacknowledged)
    HELD = "held"
    #: granted (by its own attempt or a handoff); on its way to the pool with the grant
    GRANTED = "granted"
    #: in the pool with its grant: the body releases it
    RUNNING = "running"
    #: to the pool without a grant, with its place and claim (Redis failed at its attempt,
    #: or held too long: it parks)
    HANDED_OVER = "handed-over"
    #: waited past max_wait: place withdrawn; the body raises SemaphoreTimeout
    TIMED_OUT = "timed-out"
    #: revoked or expired while held: place withdrawn, the message acknowledged
    REVOKED = "revoked"
    #: the worker stopped first (or its pool stopped without starting it): place withdrawn
    #: or grant given back; the broker delivers the message again
    GIVEN_BACK = "given-back"
    #: its request is done in the pool (or its grant was released for it)
    DONE = "done"


#: the only moves a delivery makes
TRANSITIONS: dict[Stage, frozenset[Stage]] = {
    Stage.RECEIVED: frozenset(
        {
            Stage.HELD,
            Stage.GRANTED,
            Stage.HANDED_OVER,
            Stage.TIMED_OUT,
            Stage.REVOKED,
            Stage.GIVEN_BACK,
        }
    ),
    Stage.HELD: frozenset(
        {Stage.GRANTED, Stage.HANDED_OVER, Stage.TIMED_OUT, Stage.REVOKED, Stage.GIVEN_BACK}
    ),
    Stage.GRANTED: frozenset({Stage.RUNNING, Stage.DONE, Stage.GIVEN_BACK}),
    Stage.RUNNING: frozenset({Stage.DONE, Stage.GIVEN_BACK}),
    Stage.HANDED_OVER: frozenset({Stage.GIVEN_BACK}),
    Stage.TIMED_OUT: frozenset({Stage.GIVEN_BACK}),
    Stage.REVOKED: frozenset(),
    Stage.GIVEN_BACK: frozenset(),
    Stage.DONE: frozenset(),
}
#: the gate holds it (its place is in line under the gate's wake address)
HOLDING = frozenset({Stage.RECEIVED, Stage.HELD})


class IllegalMove(RuntimeError):
    """A delivery was asked to make a move :data:`TRANSITIONS` does not allow (a bug)."""


class Delivery:
    """One delivery of a ticket, as a worker's gate holds it: its claim and its stage, which
    moves only as :data:`TRANSITIONS` allows.  The gate moves it under its lock."""

    __slots__ = ("claim", "stage", "ticket")

    def __init__(self, ticket: str, claim: str) -> None:
        self.ticket = ticket
        self.claim = claim
        self.stage = Stage.RECEIVED

    def move(self, to: Stage) -> None:
        if to not in TRANSITIONS[self.stage]:
            raise IllegalMove(f"delivery of {self.ticket}: {self.stage.value} -> {to.value}")
        self.stage = to

    def __repr__(self) -> str:
        return f"<Delivery {self.ticket} {self.stage.value}>"
