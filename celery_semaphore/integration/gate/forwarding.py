"""Standby, the gate's side (see :mod:`..standby`): held tasks sent ahead into free pool slots,
and the grants, wake-ups and cancellations the gate forwards to them on their own lists."""

from __future__ import annotations

import threading
from typing import Any

from redis.exceptions import RedisError

from ... import logs
from ...core.semaphore import Semaphore
from .. import acks, wakes
from ..delivery import Stage
from ..standby import FREE_SLOTS, free_slots
from . import reqs
from .dispatch import ToPool
from .entry import Entry
from .health import Health

log = logs.get("gate")


class Ahead:
    """Sends held tasks ahead to stand by, and forwards what comes for them."""

    def __init__(self, app: Any, to_pool: ToPool, stop: threading.Event) -> None:
        self.app = app
        self.to_pool = to_pool
        self.registry = to_pool.registry
        self.consumer = to_pool.consumer
        self.key = to_pool.key
        self.health: Health = to_pool.health
        self._stop = stop

    def forward(self, entry: Entry, item: str) -> bool:
        """``item`` (a handoff or a wake-up) is for a task this gate sent ahead to stand by:
        push it onto the task's own list (one round trip, no hop through the event loop or
        the pool), and, for a grant, send the next held task ahead.  False when ``entry``
        does not stand by (any more)."""
        granted = item.startswith("h ")
        standing = self.registry.standing
        with self.registry.lock:
            if not standing.has(entry.ticket, entry.claim):
                return False
            name = standing.granted(entry.ticket, entry.claim) if granted else None
        if name is not None:  # it starts now, in the slot it waits in
            self.consumer.call_soon(acks.granted, entry.req)
        try:
            wakes.push(
                self.app,
                wakes.standby_key(self.key, entry.claim),
                item,
                ttl=wakes.STANDBY_TTL,
            )
        except RedisError as exc:
            # the task finds its grant at its next poll (its place is held under its claim)
            self.health.failed()
            log.debug("could not forward to a standby: %s", exc, semaphore=None, task_id=None)
        if name is not None:
            self.stand_by(name)
        return True

    def cancel_if_revoked(self, entry: Entry) -> None:
        """A task standing by in a pool slot was revoked (or expired): tell it, on its list,
        so that it leaves the line and does not run (a held task is dropped the same way)."""
        req = entry.req
        if not reqs.gone(req):
            return
        with self.registry.lock:
            self.registry.standing.drop(entry.ticket)
        try:
            wakes.push(
                self.app,
                wakes.standby_key(self.key, entry.claim),
                wakes.cancel_item(entry.ticket, entry.claim),
                ttl=wakes.STANDBY_TTL,
            )
        except RedisError as exc:  # it runs once granted, as a revoked running task would
            self.health.failed()
            log.debug("could not cancel a standby: %s", exc, semaphore=None, task_id=req.id)

    def stand_by(self, name: str) -> None:
        """Send the first held tasks of the semaphore ``name`` ahead, into free pool slots,
        while it has room for more standbys (``semaphore_worker_standby``), it turns over on
        this worker, and the pool keeps a slot free for other work."""
        if self._stop.is_set():
            return
        registry, standing = self.registry, self.registry.standing
        chosen: list[Entry] = []
        with registry.lock:
            want = standing.wanted(name)
            if want <= 0 or not registry.has_held():
                return
            # standbys not yet started in the pool are not in its count of active requests
            room = free_slots(self.consumer.pool) - standing.total() - (FREE_SLOTS - 1)
            want = min(want, room)
            # the earliest in line: a later one would stand by while the grant goes ahead of it
            for entry in sorted(registry.held_entries(), key=lambda e: e.order):
                if len(chosen) >= want:
                    break
                if _may_stand_by(entry, name):
                    chosen.append(entry)
            for entry in chosen:
                registry.settle(entry, "standby")
                standing.add(entry.ticket, name, entry.claim, entry.opts.slot_wait_timeout)
        for entry in chosen:
            self.to_pool.hand_over(entry, "standby")


def _may_stand_by(entry: Entry, name: str) -> bool:
    """May the held ``entry`` be sent ahead for the semaphore ``name``?"""
    return (
        entry.sem.name == name
        and entry.stage is Stage.HELD
        and entry.ready
        and not entry.busy
        and not entry.retry_at
        and isinstance(entry.sem, Semaphore)
        and entry.opts.slot_wait_timeout > 0
        and not reqs.time_limited(entry.req)
    )
