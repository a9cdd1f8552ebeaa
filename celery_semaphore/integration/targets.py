"""What one call of a limited task takes: the concrete semaphores, weights and partition.

:func:`resolve` turns a :class:`~.spec.LimitSpec` and a call (its arguments and the queue it
came from) into a :class:`Plan`: for each member a :class:`Target` (the formatted name, its limit
after ``semaphore_limits``, the weight, the partition's cap) plus the partition and its share
weight.  The task body's wrapper (:mod:`.runtime`) and the worker's gate (:mod:`.gate`) both
use it, so a task is counted the same way wherever it acquires.
"""

from __future__ import annotations

import hashlib
import inspect
import reprlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..core import _validate
from ..core.exceptions import SemaphoreRequestError
from ..core.rates import Rate, parse_rates
from . import config
from .bykey import PerCall
from .spec import (
    LimitSpec,
    Member,
    _Queue,
    check_cap,
    check_group_rates,
    check_rate_weight,
    check_weight,
)
from .templates import Template, call_arguments

__all__ = ["Plan", "Target", "arguments_of", "resolve"]


@dataclass(frozen=True)
class Target:
    """One semaphore a call takes."""

    member: Member
    name: str
    limit: int
    weight: int
    #: the most units the call's partition may hold of this semaphore (None: no cap)
    partition_cap: int | None = None
    #: the rate windows of this semaphore (``rate=``, or the key's)
    rates: tuple[Rate, ...] = ()

    @property
    def template(self) -> str | None:
        """The name template (or callable) this name was made from; None for a fixed name."""
        return self.member.name if self.member.dynamic_name else None


@dataclass(frozen=True)
class Plan:
    targets: tuple[Target, ...]
    #: the partition (line) the call waits in; "" is the default (one line)
    partition: str = ""
    partition_weight: int = 1
    #: the call's priority (0-9, higher first), its line's bound and the task's policy when
    #: that is full (see :mod:`.full`)
    priority: int = 0
    max_waiting: int | None = None
    on_full: str = "wait"

    def queueing(self) -> dict[str, Any]:
        """The core's priority, max_waiting and keep_newest arguments (only those set)."""
        out: dict[str, Any] = {"priority": self.priority} if self.priority else {}
        if self.max_waiting is not None:
            out["max_waiting"] = self.max_waiting
            out["keep_newest"] = self.on_full == "keep_newest"
        return out

    def to_wire(self) -> dict[str, Any]:
        """This plan as a plain value, to travel with the gate's directive to the body (which
        rebuilds it with :meth:`from_wire`, without resolving the call again)."""
        return {
            "targets": [
                [
                    t.name,
                    t.limit,
                    t.weight,
                    t.partition_cap,
                    [[r.count, r.period_seconds] for r in t.rates],
                ]
                for t in self.targets
            ],
            "partition": self.partition,
            "partition_weight": self.partition_weight,
            "priority": self.priority,
        }

    @classmethod
    def from_wire(cls, spec: LimitSpec, wire: Mapping[str, Any]) -> Plan | None:
        """The plan :meth:`to_wire` sent, for ``spec``'s members (in their order); None when
        it has another number of targets (a deployment that changed the task meanwhile)."""
        rows = wire["targets"]
        if len(rows) != len(spec.members):
            return None
        targets = tuple(
            Target(
                member,
                str(row[0]),
                int(row[1]),
                int(row[2]),
                None if row[3] is None else int(row[3]),
                # a plan from before rates had four columns
                tuple(Rate(int(c), float(p)) for c, p in row[4]) if len(row) > 4 else (),
            )
            for member, row in zip(spec.members, rows, strict=True)
        )
        priority = int(wire.get("priority", 0))  # (a plan from before priorities: 0)
        return cls(
            targets,
            str(wire["partition"]),
            int(wire["partition_weight"]),
            max(0, min(9, priority)),
            spec.max_waiting,
            spec.on_full,
        )

    def fair(self, target: Target) -> dict[str, Any]:
        """The partition arguments of the core's try_acquire/acquire/wait for ``target``."""
        return {
            "partition": self.partition,
            "partition_cap": target.partition_cap,
            "partition_weight": self.partition_weight,
        }


_sig_lock = threading.Lock()
_signatures: dict[tuple[int, str], inspect.Signature] = {}


def arguments_of(task: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The call's bound arguments by parameter name (``self`` of a bound task left out)."""
    key = (id(task.app), task.name)
    sig = _signatures.get(key)
    if sig is None:
        # task.run of a bound task is a bound method: its signature leaves ``self`` out
        sig = inspect.signature(task.run)
        with _sig_lock:
            _signatures[key] = sig
    try:
        return call_arguments(sig, args, kwargs)
    except TypeError as exc:
        raise TypeError(
            f"task {task.name}: the arguments do not fit its signature: {exc}"
        ) from None


def resolve(
    task: Any,
    spec: LimitSpec,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    queue: str | None,
    *,
    partition: str | None = None,
    message_priority: int | None = None,
) -> Plan:
    """The targets of one call.  ``partition``, when given, is the one this execution already
    waits in (kept across parking and the gate's hand-over); else it is worked out here.
    ``message_priority``: the message's (``apply_async(priority=N)``, mapped by
    ``queues.message_priority``), which wins over the task's ``priority``."""
    plan = _resolve(task, spec, args, kwargs, queue, partition)
    priority = message_priority
    if priority is None:
        priority = spec.priority if not callable(spec.priority) else plan.priority
    if (priority, spec.max_waiting, spec.on_full) == (0, None, "wait"):
        return plan
    return replace(plan, priority=priority, max_waiting=spec.max_waiting, on_full=spec.on_full)


def _resolve(
    task: Any,
    spec: LimitSpec,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    queue: str | None,
    partition: str | None,
) -> Plan:
    conf = task.app.conf
    arguments = arguments_of(task, args, kwargs) if spec.uses_arguments else {}
    if partition is None:
        partition = _short(_partition(task, spec, arguments, queue))
    if not _fixed(spec):
        return _plan(task, conf, spec, arguments, partition)
    # The same plan for every call in one partition while the settings stay the same: worked
    # out once per partition (one memo look-up, not one per setting).  The memo holds the
    # spec, so its id is not reused meanwhile; a few partitions only (a message's header
    # names one: it must not grow the table without bound).
    found: tuple[LimitSpec, dict[str, Plan]] = config.memo(
        conf, ("plans", id(spec)), lambda: (spec, {})
    )
    plans = found[1]
    plan = plans.get(partition)
    if plan is None or found[0] is not spec:
        plan = _plan(task, conf, spec, arguments, partition)
        if found[0] is spec and len(plans) < MAX_FIXED_PLANS:
            plans[partition] = plan
    return plan


#: partitions whose plan is remembered per spec (see :func:`resolve`)
MAX_FIXED_PLANS = 64


def _fixed(spec: LimitSpec) -> bool:
    """Does every call of ``spec`` in one partition get the same plan (no name, limit, rate
    or weight decided per call)?"""
    return not spec.uses_arguments and all(
        m.limit_by is None and m.rate_by is None and not m.dynamic_name and m.static_weight
        for m in spec.members
    )


def _plan(
    task: Any, conf: Any, spec: LimitSpec, arguments: Mapping[str, Any], partition: str
) -> Plan:
    targets = tuple(_target(task, conf, m, arguments, partition) for m in spec.members)
    if len(targets) > 1:
        for target in targets:
            check_group_rates(f"task {task.name}", target.name, target.rates)
    names = tuple(n for t in targets for n in (t.name, t.member.name))
    weight = config.partition_weight(conf, names, spec.queue_weights, partition)
    if not callable(spec.priority):
        return Plan(targets, partition, weight)
    shown = f"the priority callable {spec.priority!r}"
    priority = _validate.priority(
        f"task {task.name}: priority (from {spec.priority!r})",
        _user(task, shown, spec.priority, arguments),
    )
    return Plan(targets, partition, weight, priority)


#: partition names longer than this (UTF-8 bytes) are shortened to a head and a hash (the core
#: takes at most 1024 bytes)
MAX_PARTITION_TEXT = 200


def _user(
    task: Any, what: str, fn: Callable[..., Any], arguments: Mapping[str, Any], *more: Any
) -> Any:
    """``fn(arguments, *more)``: a user's per-call callable (or a template) for one call; what
    it raises fails this call with a :class:`SemaphoreRequestError` that names the task, the
    callable and the call's arguments."""
    try:
        return fn(arguments, *more)
    except Exception as exc:
        raise SemaphoreRequestError(
            f"task {task.name}: {what} raised {type(exc).__name__}: {exc} for this call "
            f"(arguments: {reprlib.repr(dict(arguments))})"
        ) from exc


def _short(partition: str) -> str:
    """``partition``, or for a long one its head, ``~`` and the SHA-256 of the whole."""
    data = partition.encode("utf-8", errors="surrogatepass")
    if len(data) <= MAX_PARTITION_TEXT:
        return partition
    return f"{partition[:64]}~{hashlib.sha256(data).hexdigest()}"


def _partition(task: Any, spec: LimitSpec, arguments: Mapping[str, Any], queue: str | None) -> str:
    rule = spec.partition
    if rule is None:
        return ""
    if isinstance(rule, _Queue):
        return queue or ""
    if isinstance(rule, Template):
        return str(_user(task, f"the partition template {rule.text!r}", rule.render, arguments))
    value = _user(task, f"the partition callable {rule!r}", rule, arguments)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(
            f"task {task.name}: the partition callable returned {type(value).__name__} "
            f"{value!r}; it must return a str (or None for the default partition)"
        )
    return value


def _target(
    task: Any, conf: Any, member: Member, arguments: Mapping[str, Any], partition: str
) -> Target:
    if member.name_fn is not None:
        value = _user(task, f"the name callable {member.name}", member.name_fn, arguments)
        if not isinstance(value, str) or not value:
            raise TypeError(
                f"task {task.name}: the name callable {member.name} returned "
                f"{type(value).__name__} {value!r}; it must return a non-empty str"
            )
        name = value
    elif member.template is not None and member.template.dynamic:
        name = _user(
            task, f"the semaphore name template {member.name!r}", member.template.render, arguments
        )
        if not name:
            raise ValueError(
                f"task {task.name}: the semaphore name template {member.name!r} gave an empty "
                "name for this call; give it some fixed text, e.g. 'api:{customer_id}'"
            )
    else:
        name = member.name
    template = member.name if member.dynamic_name else None
    code_limit = member.limit
    if member.limit_by is not None:
        code_limit = _validate.positive_int(
            f"task {task.name}: semaphore {name!r}: limit (from {member.limit_by.shown})",
            _user(
                task,
                f"limit (from {member.limit_by.shown})",
                member.limit_by.value,
                arguments,
                name,
            ),
        )
    rates = member.rates
    if member.rate_by is not None:
        rates = _rates(task, name, member.rate_by, arguments)
    rates = config.semaphore_rates(conf, name, rates, template)
    limit = config.semaphore_limit(conf, name, code_limit, template)
    weight = member.weight
    where = "semaphore_limits" if limit != code_limit else "limit="
    if member.weight_fn is not None:
        weight = _validate.positive_int(
            f"task {task.name}: weight (from {member.weight_fn!r})",
            _user(task, f"the weight callable {member.weight_fn!r}", member.weight_fn, arguments),
        )
    check_weight(f"task {task.name}", name, weight, limit, where)
    check_rate_weight(f"task {task.name}", name, weight, rates)
    names = (name, member.name) if template is not None else (name,)
    cap = config.partition_cap(conf, names, member.queue_limits, partition)
    check_cap(f"task {task.name}", name, weight, partition, cap, "queue_limits")
    return Target(member, name, limit, weight, cap, rates)


#: rate values a callable returned, parsed (a few distinct values are the common case)
_parsed_rates: dict[Any, tuple[Rate, ...]] = {}


def _rates(
    task: Any, name: str, rate_by: PerCall, arguments: Mapping[str, Any]
) -> tuple[Rate, ...]:
    """The rate windows one call's key gets (a table's entries were parsed at decoration)."""
    value = _user(task, f"rate (from {rate_by.shown})", rate_by.value, arguments, name)
    if rate_by.table is not None:
        return tuple(value)
    key = tuple(value) if isinstance(value, list) else value
    try:
        found = _parsed_rates.get(key) if isinstance(key, (str, tuple, Rate)) else None
    except TypeError:  # an unhashable item: parse_rates says what is wrong with it
        key, found = None, None
    if found is None:
        found = parse_rates(
            f"task {task.name}: semaphore {name!r}: rate (from {rate_by.shown})", value
        )
        if isinstance(key, (str, tuple, Rate)) and len(_parsed_rates) < 1024:
            _parsed_rates[key] = found
    return found
