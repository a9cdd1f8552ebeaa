"""The wire format between Python and the Lua scripts (``scripts/*.lua``): the ARGV each
script takes, packed here, and the replies they give, read here.

Each ``*_args`` function returns a script's ARGV but its last argument (the dispatch flag that
:meth:`~celery_semaphore.core.base.SemaphoreBase._run` appends); each reader takes a raw reply
(bytes or str, as the client gives them) and returns its values and the *wake items* that
follow them: ``ticket, data`` pairs (a group's scripts put the member's index, 1-based, before
each pair), read with :func:`wake_pairs` or :func:`group_wake_pairs`.  The scripts' own headers
describe every argument and reply field; the integers of a call travel as one space-separated
argument (fewer arguments to send).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .info import HolderInfo, PartitionInfo, RateWindowInfo, Snapshot, ThrottleResult, WaiterInfo
from .permit import STATUSES, Attempt, AttemptStatus, GroupPermit, Permit
from .rates import Rate
from .request import done_mode

if TYPE_CHECKING:
    from .group import SemaphoreGroup
    from .request import AcquireRequest
    from .semaphore import Semaphore

#: wake_grace_ms of every script but acquire's (the caller's): named once a second at most
GRACE_MS = 1000

Reply = list[Any]


def text(value: Any) -> str:
    """A reply value (bytes or str) as str."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


# -- owner metadata ---------------------------------------------------------------------------

_owner_text: str | None = None


def _forget_owner() -> None:
    global _owner_text
    _owner_text = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_owner)


def default_owner_text() -> str:
    """``{"host": ..., "pid": ...}`` as JSON, computed once per process (again after a fork)."""
    global _owner_text
    if _owner_text is None:
        _owner_text = json.dumps({"host": socket.gethostname(), "pid": os.getpid()})
    return _owner_text


def owner_text(owner: Mapping[str, Any] | None) -> str:
    """Owner metadata as the scripts store it (JSON text; default: host and pid)."""
    if owner is not None:
        return json.dumps(dict(owner), default=str)
    return _owner_text or default_owner_text()


def parse_owner(raw: Any) -> dict[str, Any]:
    """Stored owner metadata read back (``{"raw": ...}`` when it is not JSON)."""
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return {"raw": raw}
    return value if isinstance(value, dict) else {"value": value}


# -- wake items -------------------------------------------------------------------------------


def wake_pairs(items: Sequence[Any]) -> list[tuple[str, str]]:
    """A script's wake items, ``ticket, data`` repeated, as (ticket, wake data) pairs ('' for
    a blocked waiter, woken through its own list)."""
    return [(text(items[i]), text(items[i + 1])) for i in range(0, len(items) - 1, 2)]


def group_wake_pairs(items: Sequence[Any]) -> dict[int, list[tuple[str, str]]]:
    """A group script's wake items, ``member index (1-based), ticket, data`` repeated, as
    (ticket, data) pairs by member index (0-based)."""
    by_member: dict[int, list[tuple[str, str]]] = {}
    for i in range(0, len(items) - 2, 3):
        pair = (text(items[i + 1]), text(items[i + 2]))
        by_member.setdefault(int(items[i]) - 1, []).append(pair)
    return by_member


# -- acquire ----------------------------------------------------------------------------------

#: the first character of a stored waiter's wake data when it is not ready (see _lib.lua)
NOT_READY = "~"


def acquire_args(
    request: AcquireRequest,
    limit: int,
    lease_ttl: float,
    aging_ms: int,
    rate_text: str,
    step_ms: int = 0,
) -> list[Any]:
    """acquire.lua's ARGV for a checked ``request`` (``lease_ttl``: the semaphore's, for a
    request that names none; ``step_ms``: the semaphore's priority step)."""
    # unpacked at once and converted inline: this runs on every attempt
    ticket, weight, owner, place, claim, data, grace, epoch, done, new, lease, part, cap, pw = (
        request[:14]
    )
    ready, priority, most, newest = request[15:]
    numbers = (
        f"{weight} {limit} {max(1, int((lease or lease_ttl) * 1000))} {int(place * 1000)} "
        f"{int(grace * 1000)} {epoch} {1 if done else 2 if new else 0} "
        f"{-1 if cap is None else cap} {pw} {aging_ms} {1 if ready else 0} "
        f"{priority} {priority * step_ms} {-1 if most is None else most} {1 if newest else 0}"
    )
    return [ticket, numbers, claim, owner_text(owner), data, part, rate_text]


def _over_limit(name: str, weight: int, limit: int) -> ValueError:
    return ValueError(
        f"weight={weight} is not accepted for semaphore {name!r}: it exceeds the "
        f"limit in force ({limit}, a runtime override); use a weight from 1 to {limit}"
    )


#: a reply read: the attempt, the wake items, and the error to raise (after the wake-ups)
Read = tuple[Attempt, Reply, ValueError | None]


def lapsed(reply: Reply) -> int:
    """acquire.lua's reply: the holders the call took back because their lease expired."""
    return int(reply[6])


def attempt(sem: Semaphore, request: AcquireRequest, reply: Reply) -> Read:
    """acquire.lua's reply: the :class:`Attempt`, the wake items, and the error a weight
    over the limit in force is (None: the attempt stands)."""
    status = STATUSES[int(reply[0])]
    limit = int(reply[4])
    wakes = reply[7:] if len(reply) > 7 else []
    if status is AttemptStatus.GRANTED or status is AttemptStatus.ALREADY_HELD:
        expiry = int(reply[2]) / 1000
        permit = Permit(sem, request.ticket, request.weight, int(reply[1]), expiry, request.claim)
        return Attempt(status, permit, None, 0, limit), wakes, None
    if status is AttemptStatus.WAITING:
        rate_ms = int(reply[5])
        retry = rate_ms / 1000 if rate_ms > 0 else None
        return Attempt(status, None, int(reply[1]), int(reply[2]), limit, retry), wakes, None
    if status is AttemptStatus.STALE:
        return Attempt(status, epoch=int(reply[1]), limit=limit), wakes, None
    if status is AttemptStatus.WEIGHT_OVER_LIMIT:
        return Attempt(status, limit=limit), wakes, _over_limit(sem.name, request.weight, limit)
    return Attempt(status, limit=limit), wakes, None


def group_acquire_args(
    request: AcquireRequest,
    members: Sequence[tuple[int, int, int]],
    lease_ttl: float,
    aging_ms: int,
) -> list[Any]:
    """group_acquire.lua's ARGV for a checked ``request``; ``members``: (weight, limit, cap)
    of each member, in the group's order; ``lease_ttl`` for a request that names none."""
    r = request
    numbers = (
        f"{max(1, int((r.lease_ttl or lease_ttl) * 1000))} {int(r.place_ttl * 1000)} "
        f"{int(r.wake_grace * 1000)} {r.epoch} {done_mode(r.check_done, r.new_execution)} "
        f"{r.partition_weight} {aging_ms}"
    )
    spec = " ".join(f"{weight} {limit} {cap}" for weight, limit, cap in members)
    return [r.ticket, numbers, r.claim, owner_text(r.owner), r.wake_data, r.partition, spec]


def group_attempt(group: SemaphoreGroup, request: AcquireRequest, reply: Reply) -> Read:
    """group_acquire.lua's reply: as :func:`attempt`'s (the permit a :class:`GroupPermit`)."""
    status = STATUSES[int(reply[0])]
    m = int(reply[5])
    wakes = reply[6 + m :] if len(reply) > 6 + m else []
    ticket, claim = request.ticket, request.claim
    if status is AttemptStatus.GRANTED or status is AttemptStatus.ALREADY_HELD:
        expiry = int(reply[2]) / 1000
        fences = [int(v) for v in reply[6 : 6 + m]]
        permits = [
            Permit(sem, ticket, weight, fence, expiry, claim)
            for (sem, weight), fence in zip(group.members, fences, strict=True)
        ]
        return Attempt(status, GroupPermit(group, ticket, permits, expiry, claim)), wakes, None
    if status is AttemptStatus.WAITING:
        return Attempt(status, position=int(reply[1]), epoch=int(reply[2])), wakes, None
    if status is AttemptStatus.STALE:
        return Attempt(status, epoch=int(reply[1])), wakes, None
    if status is AttemptStatus.WEIGHT_OVER_LIMIT:
        sem, weight = group.members[int(reply[4]) - 1]
        return Attempt(status), wakes, _over_limit(sem.name, weight, int(reply[1]))
    return Attempt(status), wakes, None


# -- release, refresh, withdraw ---------------------------------------------------------------

#: one handoff a release made: ticket, wake data, fencing token, lease expiry (server epoch
#: seconds), claim
Handoff = tuple[str, str, int, float, str]


def release_args(
    token: str, limit: int, tomb_ms: int, aging_ms: int, timed: bool, handoff_ms: int, claim: str
) -> list[Any]:
    """release.lua's ARGV (``handoff_ms`` 0: grant nothing by handoff)."""
    numbers = f"{limit} {tomb_ms} {GRACE_MS} {aging_ms} {1 if timed else 0} {handoff_ms}"
    return [token, numbers, claim]


def release_reply(reply: Reply, handoff: bool) -> tuple[int, Sequence[Handoff], Reply]:
    """release.lua's reply: status, the handoffs made (when ``handoff_ms`` was > 0), and the
    wake items."""
    if not handoff or len(reply) == 1:
        return int(reply[0]), (), reply[1:]
    end = 2 + 5 * int(reply[1])
    handed = [
        (
            text(reply[i]),
            text(reply[i + 1]),
            int(reply[i + 2]),
            int(reply[i + 3]) / 1000,
            text(reply[i + 4]),
        )
        for i in range(2, end, 5)
    ]
    return int(reply[0]), handed, reply[end:]


def group_release_args(
    token: str, tomb_ms: int, aging_ms: int, timed: bool, claim: str, limits: str
) -> list[Any]:
    """group_release.lua's ARGV (``limits``: :func:`limits_text`)."""
    return [token, f"{tomb_ms} {GRACE_MS} {aging_ms} {1 if timed else 0}", claim, limits]


def group_release_reply(reply: Reply) -> tuple[list[int], Reply]:
    """group_release.lua's reply: each member's status (as release.lua's), the wake items."""
    m = int(reply[0])
    return [int(v) for v in reply[1 : 1 + m]], reply[1 + m :]


def limits_text(limits: Sequence[int]) -> str:
    """The members' limits as a group script takes them."""
    return " ".join(str(limit) for limit in limits)


def refresh_args(
    token: str, lease_ms: int, place_ms: int, limit: int, aging_ms: int, claim: str
) -> list[Any]:
    """refresh.lua's ARGV."""
    return [token, lease_ms, place_ms, limit, GRACE_MS, aging_ms, claim]


def group_refresh_args(
    token: str, lease_ms: int, place_ms: int, aging_ms: int, limits: str, claim: str
) -> list[Any]:
    """group_refresh.lua's ARGV, to refresh."""
    return [token, f"r {lease_ms} {place_ms} {GRACE_MS} {aging_ms}", limits, claim]


def group_withdraw_args(ticket: str, aging_ms: int, limits: str) -> list[Any]:
    """group_refresh.lua's ARGV, to withdraw."""
    return [ticket, f"w 1 1 {GRACE_MS} {aging_ms}", limits]


def refresh_reply(reply: Reply) -> tuple[int, float, Reply]:
    """refresh.lua's (and group_refresh.lua's) reply: status, expiry (server epoch seconds),
    and the wake items."""
    return int(reply[0]), int(reply[1]) / 1000, reply[2:]


def withdraw_args(ticket: str, limit: int, aging_ms: int, wake: bool) -> list[Any]:
    """withdraw.lua's ARGV."""
    return [ticket, limit, GRACE_MS, aging_ms, 1 if wake else 0]


def status_reply(reply: Reply) -> tuple[int, Reply]:
    """withdraw.lua's and reclaim.lua's reply: the status (or count), the wake items."""
    return int(reply[0]), reply[1:]


# -- maintenance ------------------------------------------------------------------------------


def reclaim_args(limit: int, aging_ms: int) -> list[Any]:
    """reclaim.lua's ARGV."""
    return [limit, GRACE_MS, aging_ms]


def sweep_args(limit: int, aging_ms: int, fresh_marker: str) -> list[Any]:
    """sweep.lua's ARGV."""
    return [limit, GRACE_MS, aging_ms, fresh_marker]


def sweep_reply(reply: Reply) -> tuple[tuple[int, int, str, int], Reply]:
    """sweep.lua's reply: (holders reclaimed, of them those of dead processes, marker, fence),
    the wake items."""
    return (int(reply[0]), int(reply[1]), text(reply[2]), int(reply[3] or 0)), reply[4:]


def throttle_args(
    limit: int, retry_ms: int, adaptive: bool, fence: int, aging_ms: int
) -> list[Any]:
    """throttle.lua's ARGV."""
    return [f"{limit} {retry_ms} {1 if adaptive else 0} {fence} {GRACE_MS} {aging_ms}"]


def throttle_reply(reply: Reply) -> tuple[ThrottleResult, Reply]:
    """throttle.lua's reply: the :class:`ThrottleResult`, the wake items."""
    paused_ms = int(reply[2])
    result = ThrottleResult(
        decreased=int(reply[0]) == 1,
        effective_limit=int(reply[1]),
        paused_for=paused_ms / 1000 if paused_ms > 0 else None,
        throttles_total=int(reply[3]),
    )
    return result, reply[4:]


# -- inspect ----------------------------------------------------------------------------------


def snapshot(name: str, limit: int, reply: Reply) -> Snapshot:
    """inspect.lua's reply as the :class:`Snapshot` of semaphore ``name`` (``limit``: this
    client's, in force unless overridden)."""
    now_ms = int(reply[0])
    override_text = text(reply[2])
    override = int(override_text) if override_text else None
    n_holders, n_waiters, n_parts = int(reply[3]), int(reply[4]), int(reply[5])
    hold_text = text(reply[7])
    rest = reply[9:]
    holders = [_holder(rest[9 * i : 9 * i + 9], now_ms) for i in range(n_holders)]
    rest = rest[9 * n_holders :]
    found = [_waiter(rest[9 * i : 9 * i + 9], now_ms) for i in range(n_waiters)]
    found.sort(key=lambda pair: pair[0])  # the line is by partition; report arrival order
    rest = rest[9 * n_waiters :]
    partitions = [_partition(rest[5 * i : 5 * i + 5]) for i in range(n_parts)]
    rest = rest[5 * n_parts :]
    n_rates = int(rest[0])
    rates = [_rate_window(rest[1 + 5 * i : 6 + 5 * i]) for i in range(n_rates)]
    overridden, cwnd, pause_ms, throttles, last_ms, full, dropped, died = (
        int(v) for v in rest[1 + 5 * n_rates : 9 + 5 * n_rates]
    )
    in_force = override if override is not None else limit
    return Snapshot(
        name=name,
        limit=in_force,
        limit_override=override,
        used=int(reply[1]),
        server_time=now_ms / 1000,
        holders=holders,
        waiters=[info for _, info in found],
        partitions=partitions,
        grants_total=int(reply[6]),
        hold_time_avg=int(hold_text) / 1000 if hold_text else None,
        reclaimed_total=int(reply[8]),
        rates=rates,
        rate_override=[w.rate for w in rates] if overridden else None,
        adaptive_limit=cwnd if 0 < cwnd < in_force else None,
        paused_for=pause_ms / 1000 if pause_ms > 0 else None,
        throttles_total=throttles,
        last_throttle_age=max(0, now_ms - last_ms) / 1000 if last_ms else None,
        full_total=full,
        dropped_total=dropped,
        died_total=died,
    )


def _holder(fields: Reply, now_ms: int) -> HolderInfo:
    token, expiry, weight, fence, acquired, owner, part, ident, record = fields
    process, record_text = text(ident) or None, text(record)
    remaining: float | None = None
    alive: bool | None = None
    if process is not None and record_text == "-":  # no record: its process is dead
        alive = False
    elif process is not None and record_text:
        remaining = (float(record_text) - now_ms) / 1000
        alive = remaining > 0
    return HolderInfo(
        token=text(token),
        weight=int(weight),
        fencing_token=int(text(fence)),
        acquired_at=int(text(acquired)) / 1000,
        lease_remaining=(float(text(expiry)) - now_ms) / 1000,
        owner=parse_owner(text(owner)),
        partition=text(part),
        process=process,
        liveness_remaining=remaining,
        process_alive=alive,
    )


def _waiter(fields: Reply, now_ms: int) -> tuple[int, WaiterInfo]:
    """(arrival number, the waiter)."""
    ticket, expiry, weight, since, raw_data, owner, part, pos, seq = fields
    data, order = text(raw_data), text(seq)
    info = WaiterInfo(
        ticket=text(ticket),
        position=int(pos),
        weight=int(weight),
        waiting_since=int(text(since)) / 1000,
        place_remaining=(float(text(expiry)) - now_ms) / 1000,
        parked=bool(data) and not data.startswith(NOT_READY),
        owner=parse_owner(text(owner)),
        partition=text(part),
        ready=not data.startswith(NOT_READY),
        priority=order_priority(order),
    )
    return int(order), info


def order_priority(order: str) -> int:
    """A waiter's priority, from its order in the line (see _lib.lua: a place taken before
    priorities existed has priority 0)."""
    return int(order[-1]) if len(order) == 31 else 0


def _partition(fields: Reply) -> PartitionInfo:
    name, used, waiting, cap, part_weight = fields
    return PartitionInfo(
        name=text(name),
        used=int(used),
        waiters=int(waiting),
        cap=None if int(cap) < 0 else int(cap),
        weight=int(part_weight),
    )


def _rate_window(fields: Reply) -> RateWindowInfo:
    count, period_ms, started, opens_ms, spaced = fields
    return RateWindowInfo(
        rate=Rate(int(count), int(period_ms) / 1000, spaced=int(spaced) == 1),
        started=int(started),
        opens_in=max(0, int(opens_ms)) / 1000,
    )
