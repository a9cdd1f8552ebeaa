"""The operator's actions on a semaphore, one implementation for the CLI and the web page:
force-release permits, reset, set or clear the runtime limit, and set or clear the runtime
rate.

Each action is logged and recorded in the audit list (:mod:`.audit`).  The semaphore an action
works on wakes tasks as a worker's release does (:func:`operable`): a task held by a worker's
gate or parked in the broker asks again at once.  A forced release leaves its reason in Redis
(``Semaphore.release_token(reason=...)``), which the running task's heartbeat logs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.semaphore import HolderInfo, Semaphore, Snapshot
from ..integration.wakes import WakeRouter
from . import audit, registry, views

__all__ = ["Reset", "force_release", "operable", "parse_rate", "reset", "set_limit", "set_rate"]


def operable(
    app: Any, client: Any, prefix: str, entry: registry.Known, hash_tag: str | None
) -> Semaphore:
    """A Semaphore for ``entry`` whose releases and withdrawals wake the tasks a worker holds
    or that are parked in the broker (through the Celery layer's :class:`WakeRouter`)."""
    on_wake = WakeRouter(app, entry.name)
    return views.semaphore_for_known(client, prefix, entry, hash_tag, on_wake)


def _who(detail: Mapping[str, Any]) -> str:
    """Who acts, as the released task's worker log will say it."""
    me = audit.operator()
    label = f"{me['user']}@{me['host']}"
    if detail.get("via") == "web":
        named = detail.get("operator")
        return (
            f"{named + ' ' if named else ''}via the web page ({label}, from {detail.get('remote')})"
        )
    return f"{label} (celery semaphore)"


def force_release(
    client: Any,
    prefix: str,
    sem: Semaphore,
    snap: Snapshot,
    holders: Sequence[HolderInfo],
    **detail: Any,
) -> list[bool]:
    """Release ``holders`` (of ``snap``) now, each logged and recorded with ``detail`` (e.g.
    ``via``); True for each that was still held."""
    reason = f"forced by {_who(detail)}"
    out = []
    for holder in holders:
        # timed=False: its task did not end; the reason is what its heartbeat will log
        released = sem.release_token(holder.token, timed=False, reason=reason)
        audit.record(
            client,
            prefix,
            "release",
            sem.name,
            token=holder.token,
            task_id=holder.owner.get("task_id"),
            task=holder.owner.get("task"),
            holder_host=holder.owner.get("host") or holder.owner.get("machine"),
            holder_pid=holder.owner.get("pid"),
            weight=holder.weight,
            held=round(snap.server_time - holder.acquired_at, 3),
            released=released,
            **detail,
        )
        out.append(released)
    return out


@dataclass(frozen=True)
class Reset:
    released: int  #: holders released
    withdrawn: int  #: waiters withdrawn (each woken, to ask again)
    forgot: bool  #: removed from the registry


def reset(
    client: Any, prefix: str, sem: Semaphore, *, forget: bool = False, **detail: Any
) -> Reset:
    """Withdraw every waiter (waking each, so it asks again at once) and release every holder
    (leaving the reason for its heartbeat); recorded with ``detail``."""
    snap = sem.inspect()
    withdrawn = sum(1 for w in snap.waiters if sem.withdraw(w.ticket, wake=True))
    why = f"reset by {_who(detail)}"
    released = sum(1 for h in snap.holders if sem.release_token(h.token, timed=False, reason=why))
    sem.reclaim()
    forgot = registry.forget(client, prefix, sem.name) if forget else False
    audit.record(
        client,
        prefix,
        "reset",
        sem.name,
        holders=released,
        waiters=withdrawn,
        tokens=[h.token for h in snap.holders],
        forgot=forgot,
        **detail,
    )
    return Reset(released, withdrawn, forgot)


def set_limit(
    client: Any,
    prefix: str,
    sem: Semaphore,
    entry: registry.Known,
    limit: int | None,
    **detail: Any,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Set (None: clear) the runtime override; the limit info before and after."""
    before = views.limit_info(entry, sem.inspect())
    sem.set_limit_override(limit)
    after = views.limit_info(entry, sem.inspect())
    audit.record(
        client,
        prefix,
        "set-limit" if limit is not None else "clear-limit",
        sem.name,
        limit=limit,
        previous=before["limit"],
        previous_source=before["source"],
        **detail,
    )
    return before, after


#: the rate text that clears the runtime rate override (``set-limit NAME --rate none``)
NO_RATE = "none"


def parse_rate(values: Sequence[str]) -> tuple[Any, ...] | None:
    """The windows of ``values`` (each ``"N/period"``, e.g. ``["60/m", "1000/h"]``; a value
    may also list several, comma-separated), checked by the core; None for ``["none"]``
    (clear the override).  Raises the core's ``ValueError``/``TypeError``, which names the
    parameter (``rate``) and the value, before anything is changed."""
    from ..core.rates import parse_rates

    items = [part.strip() for value in values for part in str(value).split(",")]
    if [item.lower() for item in items] == [NO_RATE]:
        return None
    if any(item.lower() == NO_RATE for item in items):
        raise ValueError(
            f"rate={', '.join(values)!r} is not accepted: 'none' (clear the runtime rate) "
            "cannot be given with other windows"
        )
    return parse_rates("rate", items)  # never empty: every item is checked, "" included


def set_rate(
    client: Any,
    prefix: str,
    sem: Semaphore,
    rates: Sequence[Any] | None,
    **detail: Any,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Set (None: clear) the runtime rate override (:meth:`Semaphore.set_rate_override`):
    every client obeys these windows in place of the ``rate=`` its acquirers send.  The rate
    info (:func:`views.rate_info`) before and after; recorded like :func:`set_limit`."""
    before = views.rate_info(sem.inspect())
    stored = sem.set_rate_override(list(rates) if rates is not None else None)
    after = views.rate_info(sem.inspect())
    audit.record(
        client,
        prefix,
        "set-rate" if stored is not None else "clear-rate",
        sem.name,
        rate=None if stored is None else ", ".join(str(r) for r in stored),
        previous=before["rate"],
        previous_source=before["source"],
        **detail,
    )
    return before, after


def clear_throttle(client: Any, prefix: str, sem: Semaphore, **detail: Any) -> bool:
    """End a throttle pause and forget a lowered adaptive limit at once
    (:meth:`Semaphore.clear_throttle`); whether there was anything to clear.  Recorded like
    :func:`set_limit`."""
    snap = sem.inspect()
    cleared = sem.clear_throttle()
    audit.record(
        client,
        prefix,
        "clear-throttle",
        sem.name,
        previous=snap.adaptive_limit,
        paused_for=snap.paused_for,
        **detail,
    )
    return cleared
