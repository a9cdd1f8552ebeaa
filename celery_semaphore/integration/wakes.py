"""The items on a worker gate's wake list, each tagged with its kind.

A release in another process tells a gate about the tasks it holds by pushing items onto the
gate's wake list in Redis.  Two kinds of item travel there, and a task id (which any sender
chooses) must never be read as the other kind, so every item starts with a tag written here,
never by a user:

* ``w <ticket>``: units were freed for ``ticket``: the gate claims them itself;
* ``h <fence> <expiry ms> <claim> <ticket>``: a release *granted* ``ticket`` its units (a
  handoff) under ``claim``, which only the waiting delivery and the release script know.  The
  gate trusts it only when the claim is the one of the delivery it holds.

A task the gate sent ahead to stand by in a pool slot (see :mod:`.standby`) waits on a list of
its own (:func:`standby_key`): the gate forwards there the ``w`` and ``h`` items it gets for
that task, and adds ``x <claim> <ticket>`` when the task was revoked (or expired) meanwhile.

Anything else (the empty item that ends the gate's blocking pop at stop, an item from an
older version) is not an item: :func:`parse` returns None.

A release in the gate's own process skips Redis: the gate registers itself here
(:func:`register`), and :class:`WakeRouter`, the wake-up and handoff callback of the Celery
layer's semaphores, calls it directly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

from kombu.utils import json as kombu_json

from .. import logs
from ..core.semaphore import HANDOFF_MARK
from . import config
from .clients import client_for
from .delivery import task_id_of

__all__ = [
    "GATE_WAKE_TTL",
    "STANDBY_TTL",
    "Handoff",
    "Cancel",
    "HeldTask",
    "Receiver",
    "Wake",
    "WakeRouter",
    "gate_key",
    "cancel_item",
    "handoff_item",
    "held",
    "parse",
    "push",
    "register",
    "gate_wake_data",
    "standby_key",
    "unregister",
    "wake_item",
]

log_wait = logs.get("wait")


def gate_key(key_prefix: str, node: str, nonce: str) -> str:
    """The list a worker node's gate waits on for the items of the tasks it holds; ``nonce``
    tells apart successive runs of a node with the same name."""
    # the nonce as the hash tag: on Redis Cluster the gate's lists (this key and those that
    # extend it, e.g. its handoff list) share a slot, so one BLMPOP waits on all of them
    return f"{key_prefix}:gate:{quote(node, safe='-_.')}:{{{nonce}}}"


#: what separates a standby list's key from its gate's key
_STANDBY_SEP = ":sb:"


def standby_key(gate: str, claim: str) -> str:
    """The list a task the gate ``gate`` sent ahead to stand by in a pool slot waits on: one
    per delivery (``claim``), in the gate key's hash slot."""
    return f"{gate}{_STANDBY_SEP}{claim}"


def gate_wake_data(standby: str) -> str:
    """The wake data of the place of a task standing by on the list ``standby``: still its
    gate's (a release hands its units to the gate, which forwards them), taking handoffs."""
    return "@" + standby.rpartition(_STANDBY_SEP)[0] + HANDOFF_MARK


@dataclass(frozen=True)
class Wake:
    """Units were freed for ``ticket``."""

    ticket: str


@dataclass(frozen=True)
class Handoff:
    """A release granted ``ticket`` its units under ``claim``."""

    ticket: str
    fence: int
    expires_at: float  #: server epoch seconds
    claim: str


@dataclass(frozen=True)
class Cancel:
    """The task standing by as ``ticket`` under ``claim`` was revoked: it must not run."""

    ticket: str
    claim: str


def cancel_item(ticket: str, claim: str) -> str:
    return f"x {claim} {ticket}"


def wake_item(ticket: str) -> str:
    return f"w {ticket}"


def handoff_item(ticket: str, fence: int, expires_at: float, claim: str) -> str:
    # the claim is a hex string (no spaces), so the ticket is everything after it
    return f"h {fence} {round(expires_at * 1000)} {claim} {ticket}"


def parse(item: str) -> Wake | Handoff | Cancel | None:
    """The item ``item`` read back, or None when it is not one."""
    kind, _, rest = item.partition(" ")
    if kind == "w" and rest:
        return Wake(rest)
    if kind == "x":
        claim, _, ticket = rest.partition(" ")
        return Cancel(ticket, claim) if claim and ticket else None
    if kind == "h":
        parts = rest.split(" ", 3)
        if len(parts) == 4 and parts[0].isdigit() and parts[1].isdigit() and parts[2]:
            fence, expiry_ms, claim, ticket = parts
            return Handoff(ticket, int(fence), int(expiry_ms) / 1000, claim)
    return None


@dataclass(frozen=True)
class HeldTask:
    """A request a worker's gate holds off the pool (see :func:`held`)."""

    task_id: str
    task: str
    #: the semaphore's name ("a+b" for a group)
    semaphore: str
    #: the delivery's stage: "received" (first try not made yet) or "held" (in line)
    stage: str
    #: seconds since the gate took it
    waited: float
    #: its place in line at its last try (0 is the head), None before the first
    position: int | None
    #: counted in the consumer's prefetch window (False: semaphore_worker_hold was full)
    counted: bool


class Receiver(Protocol):
    """A worker's gate, as a release in its own process reaches it (see :func:`register`)."""

    pid: int

    def wake(self, ticket: str) -> None: ...

    def handed(self, ticket: str, fence: int, expires_at: float, claim: str) -> None: ...

    def snapshot(self) -> list[HeldTask]: ...


#: the gates of this process, by wake list key (a release here reaches them without Redis)
_gates: dict[str, Receiver] = {}


def register(key: str, gate: Receiver) -> None:
    _gates[key] = gate


def unregister(key: str) -> None:
    _gates.pop(key, None)


def held() -> list[HeldTask]:
    """The requests every gate of this process holds right now (a read-only snapshot: what
    ``celery semaphore held`` shows for this worker)."""
    gates = {id(g): g for g in list(_gates.values()) if g.pid == os.getpid()}
    return [task for gate in gates.values() for task in gate.snapshot()]


def _local_gate(key: str) -> Receiver | None:
    gate = _gates.get(key)
    return gate if gate is not None and gate.pid == os.getpid() else None


class WakeRouter:
    """``on_wake`` and ``on_handoff`` of the Celery layer's semaphores: units were freed (or
    granted, by handoff) for a waiter that is not blocked in this process.  Its wake data says
    where it waits: ``@<key>``, held by a worker's gate (tell that gate: directly when it runs
    in this process, else with an item on its wake list); else a parked task's wake copy,
    published now."""

    def __init__(self, app: Any, name: str) -> None:
        self.app = app
        self.name = name  # the semaphore's, for the log

    def __call__(self, ticket: str, data: str) -> None:
        if data.startswith("@"):
            key = data[1:]
            gate = _local_gate(key)
            if gate is not None:
                gate.wake(ticket)
            else:
                push(self.app, key, wake_item(ticket))
            return
        from celery.canvas import Signature

        sig = Signature.from_dict(kombu_json.loads(data), app=self.app)  # type: ignore[no-untyped-call]
        sig.apply_async()
        log_wait.info(
            "woken: re-dispatched the parked task now (ticket %s)",
            ticket,
            semaphore=self.name,
            task_id=task_id_of(ticket),
        )

    def handoff(self, ticket: str, data: str, fence: int, expires_at: float, claim: str) -> None:
        """A release granted ``ticket`` its units under ``claim`` (see
        ``Semaphore(on_handoff=...)``): only a gate's held tasks take handoffs (wake data
        ``@<key>#handoff``); hand the grant to that gate, directly or through its wake list
        (the gate forwards it to the task's standby list when it sent the task ahead)."""
        key = data[1:]
        gate = _local_gate(key)
        if gate is not None:
            gate.handed(ticket, fence, expires_at, claim)
        else:
            push(self.app, key, handoff_item(ticket, fence, expires_at, claim))


#: seconds a gate's wake list outlives its last push (a gate that died leaves nothing behind)
GATE_WAKE_TTL = 3600
#: ... and a standby list (its task waits there for seconds, then parks)
STANDBY_TTL = 300


def push(app: Any, key: str, item: str, ttl: int = GATE_WAKE_TTL) -> None:
    """Append ``item`` to a wake list ``key`` (one round trip), which then lives ``ttl``
    seconds past its last push."""
    client = client_for(config.redis_url_for(app.conf), app.conf)
    pipe = client.pipeline(transaction=False)
    pipe.rpush(key, item)
    pipe.expire(key, ttl)
    pipe.execute()
