"""What a limited task asks for: built and checked once, when the task is decorated.

A :class:`LimitSpec` has one :class:`Member` per semaphore the task takes (a name or name
template, a limit, a weight), the partition rule (by default the queue the task was delivered
from), per-partition caps and weights, and the task-level options of :mod:`.config`.  What one
call of the task takes is worked out by :mod:`.targets`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from ..core import _validate
from ..core.rates import Rate, parse_rates
from . import config
from .bykey import DEFAULT, PerCall
from .patterns import Lookup, check_key
from .table import (
    check_bool,
    check_heartbeat,
    check_queueing,
    queue_limits_map,
    queue_weights_map,
)
from .templates import ArgsFn, Template, parameters

__all__ = [
    "QUEUE",
    "LimitSpec",
    "Member",
    "PartitionRule",
    "check_cap",
    "check_group_rates",
    "check_rate_weight",
    "check_weight",
    "in_context",
    "where_of",
]


class _Queue:
    """The default partition rule: the queue the task was delivered from."""

    def __repr__(self) -> str:
        return "QUEUE"


#: ``partition=`` default: one line per queue the task was delivered from
QUEUE: Final = _Queue()
#: what ``partition=`` accepts: QUEUE, None (one line), a template or a callable
PartitionRule = _Queue | None | Template | ArgsFn


@dataclass(frozen=True)
class Member:
    """One semaphore a limited task takes."""

    #: the name, or the name template (``"api:{customer_id}"``), or ``<callable qualname>``
    name: str
    #: the limit in code; with ``limit_by``, the table's default (``"*"``), or 0 when a
    #: callable decides it per call
    limit: int
    #: units each run takes (1 when ``weight_fn`` decides per call)
    weight: int = 1
    template: Template | None = None
    name_fn: ArgsFn | None = None
    weight_fn: ArgsFn | None = None
    #: partition name -> cap on the units that partition may hold of this semaphore
    queue_limits: Mapping[str, int] = field(default_factory=dict)
    #: a limit per key (see :mod:`.bykey`): decided per call, checked then
    limit_by: PerCall | None = None
    #: the rate windows in code (``rate=``); with ``rate_by``, decided per call
    rates: tuple[Rate, ...] = ()
    rate_by: PerCall | None = None
    #: ``adaptive=True``: ``throttled()`` lowers the limit (AIMD, see the core)
    adaptive: bool = False

    @property
    def dynamic_name(self) -> bool:
        return self.name_fn is not None or (self.template is not None and self.template.dynamic)

    @property
    def static_weight(self) -> bool:
        return self.weight_fn is None


@dataclass(frozen=True)
class LimitSpec:
    """The semaphores a task takes and the task-level options (see :mod:`.config`)."""

    members: tuple[Member, ...]
    options: Mapping[str, Any] = field(default_factory=dict)
    partition: PartitionRule = QUEUE
    #: partition name -> its share weight (1 when not listed)
    queue_weights: Mapping[str, int] = field(default_factory=dict)
    #: 0-9 (higher first), or a callable of the call's arguments (see :mod:`.full`)
    priority: int | ArgsFn = 0
    #: the most tasks that may wait in the line (None: no bound), and what a task does when
    #: it is full (``on_full``: wait, drop, fail or keep_newest)
    max_waiting: int | None = None
    on_full: str = "wait"

    @property
    def name(self) -> str:
        """The first (usually only) member's name, for logs."""
        return self.members[0].name

    @property
    def uses_arguments(self) -> bool:
        """Does resolving a call need its arguments?"""
        return (
            any(
                m.dynamic_name
                or not m.static_weight
                or any(by is not None and by.uses_arguments for by in (m.limit_by, m.rate_by))
                for m in self.members
            )
            or isinstance(self.partition, Template)
            or callable(self.partition)
            or callable(self.priority)
        )

    @classmethod
    def build(
        cls, name: object, limit: object, options: Mapping[str, Any], *, where: str
    ) -> LimitSpec:
        """The checked spec; ``where`` (the decorator and the task it is on) starts every
        error message."""
        try:
            return cls._build(name, limit, options, where)
        except (TypeError, ValueError) as exc:
            if str(exc).startswith(where):
                raise
            raise in_context(exc, f"{where}: ") from None

    @classmethod
    def _build(
        cls, name: object, limit: object, options: Mapping[str, Any], where: str
    ) -> LimitSpec:
        opts = dict(options)
        weight = opts.pop("weight", 1)
        rate = opts.pop("rate", None)
        adaptive = check_bool("adaptive", opts.pop("adaptive", False))
        partition = opts.pop("partition", QUEUE)
        queue_limits = opts.pop("queue_limits", None)
        queue_weights = opts.pop("queue_weights", None)
        queueing = (opts.pop("priority", 0), opts.pop("max_waiting", None))
        on_full = opts.pop("on_full", "wait")
        opts = config.validate_task_options(opts, where=where)
        if "heartbeat_interval" in opts and "lease_ttl" in opts:
            check_heartbeat(
                "heartbeat_interval", opts["heartbeat_interval"], "lease_ttl", opts["lease_ttl"]
            )
        caps = queue_limits_map("queue_limits", queue_limits) or {}
        names: list[object] = list(name) if isinstance(name, (list, tuple)) else [name]
        if not names:
            raise ValueError(f"{where}: name=[] is not accepted: give at least one semaphore name")
        limits = _per_name("limit", limit, names, where)
        weights = _per_name("weight", weight, names, where)
        rates = _per_name("rate", rate, names, where)
        members = tuple(
            replace(_member(n, lim, w, r, caps, where), adaptive=adaptive)
            for n, lim, w, r in zip(names, limits, weights, rates, strict=True)
        )
        _check_distinct(members, where)
        _check_group_options(members, where)
        priority, most, policy = check_queueing(*queueing, on_full, several=len(members) > 1)
        return cls(
            members,
            opts,
            _partition_rule(partition),
            queue_weights_map("queue_weights", queue_weights) or {},
            priority,
            most,
            policy,
        )

    def combine(self, other: LimitSpec, where: str) -> LimitSpec:
        """This spec and ``other`` (another ``@limited`` on the same task): one task taking
        the semaphores of both at once.  Options given in both must agree."""
        members = self.members + other.members
        _check_distinct(members, where)
        _check_group_options(members, where)
        options = dict(self.options)
        for key, value in other.options.items():
            if key in options and options[key] != value:
                raise TypeError(
                    f"{where}: {key}={value!r} here but {key}={options[key]!r} on the other "
                    f"@limited of this task; the task waits and holds all its semaphores "
                    f"together, so give {key} once (on either) or the same on both"
                )
            options[key] = value
        partition = self.partition
        if other.partition is not QUEUE:
            if partition is not QUEUE and partition != other.partition:
                raise TypeError(
                    f"{where}: partition={other.partition!r} here but "
                    f"partition={partition!r} on the other @limited of this task; a task waits "
                    f"in one partition: give partition once, or the same on both"
                )
            partition = other.partition
        weights = dict(self.queue_weights)
        for part, weight in other.queue_weights.items():
            if weights.get(part, weight) != weight:
                raise TypeError(
                    f"{where}: queue_weights[{part!r}]={weight} here but {weights[part]} on the "
                    f"other @limited of this task; a partition has one weight per task"
                )
            weights[part] = weight
        if any((s.priority, s.max_waiting, s.on_full) != (0, None, "wait") for s in (self, other)):
            raise TypeError(
                f"{where}: priority=, max_waiting= and on_full= are not accepted on a task "
                "that takes several semaphores at once (stacked @limited)"
            )
        return LimitSpec(members, options, partition, weights)

    def check_parameters(self, fun: Callable[..., Any], where: str) -> None:
        """Every template placeholder must be a parameter of the task function ``fun``."""
        params, var_kw = parameters(fun)
        for member in self.members:
            if member.template is not None:
                member.template.check("name", params, var_kw, where)
        if isinstance(self.partition, Template):
            self.partition.check("partition", params, var_kw, where)


def _per_name(param: str, value: object, names: list[object], where: str) -> list[object]:
    """One value for every name, or a dict with an entry per name (several semaphores)."""
    if not isinstance(value, Mapping):
        return [value] * len(names)
    if len(names) == 1 and (not isinstance(names[0], str) or _by_key(names[0], value)):
        return [value]  # a table by key (or the member's own check says what is wrong)
    missing = [n for n in names if n not in value]
    extra = [k for k in value if k not in names]
    if missing or extra:
        raise ValueError(
            f"{where}: {param}={dict(value)!r} is not accepted: "
            + (f"no entry for {', '.join(map(repr, missing))}" if missing else "")
            + ("; " if missing and extra else "")
            + (f"{', '.join(map(repr, extra))} is not one of the names" if extra else "")
            + f"; give {param}=<int> for every semaphore, or a dict with one entry per name"
            + (
                " (a table by key, with a '*' default, is for one name template such as "
                "'llm:{customer_id}')"
                if "*" in value
                else ""
            )
        )
    return [value[n] for n in names]


def _by_key(name: str, value: Mapping[Any, Any]) -> bool:
    """Is ``value`` a table by key for the one name ``name`` (a template), rather than a dict
    with an entry per semaphore?"""
    if list(value) == [name]:
        return False
    try:
        return Template.parse("name", name).dynamic
    except (TypeError, ValueError):
        return False


def _check_group_options(members: tuple[Member, ...], where: str) -> None:
    if len(members) < 2:
        return
    names = ", ".join(repr(m.name) for m in members)
    several = f"a task that takes several semaphores at once ({names})"
    if any(m.adaptive for m in members):
        raise ValueError(
            f"{where}: adaptive=True is not accepted on {several}: a group does not adapt its "
            "limits yet; make the task take one semaphore, or leave adaptive out"
        )
    if any(m.rates or m.rate_by is not None for m in members):
        raise ValueError(
            f"{where}: rate= is not accepted on {several}: their grants are made together, "
            "and a group does not admit rates yet; put the rate on a task that takes one "
            "semaphore"
        )


def _check_distinct(members: tuple[Member, ...], where: str) -> None:
    seen: set[str] = set()
    for member in members:
        if not member.dynamic_name and member.name in seen:
            raise ValueError(
                f"{where}: semaphore {member.name!r} is named twice; a task takes each "
                "semaphore once (use weight= to take more of its units)"
            )
        seen.add(member.name)


def _member(
    name: object,
    limit: object,
    weight: object,
    rate: object,
    caps: Mapping[str, int],
    where: str,
) -> Member:
    template: Template | None = None
    name_fn: ArgsFn | None = None
    if callable(name):
        name_fn = name
        shown = f"<{_qualname(name)}>"
    else:
        shown = _validate.name("name", name)
        template = Template.parse("name", shown)
    dynamic = name_fn is not None or (template is not None and template.dynamic)
    try:
        checked_limit, limit_by = _per_key("limit", limit, dynamic, _validate.positive_int, 0)
        rates, rate_by = _per_key("rate", rate, dynamic, parse_rates, ())
        weight_fn: ArgsFn | None = weight if callable(weight) else None
        static = 1 if weight_fn is not None else _validate.positive_int("weight", weight)
    except (TypeError, ValueError) as exc:
        # say which semaphore: a task may take several, each with its own limit and weight
        raise in_context(exc, f"{where}: semaphore {shown!r}: ") from None
    if weight_fn is None:
        if limit_by is None:
            check_weight(where, shown, static, checked_limit, "limit=")
        if rate_by is None:
            check_rate_weight(where, shown, static, rates)
        for part, cap in caps.items():
            check_cap(where, shown, static, part, cap, "queue_limits")
    return Member(
        shown,
        checked_limit,
        static,
        template,
        name_fn,
        weight_fn,
        dict(caps),
        limit_by,
        rates,
        rate_by,
    )


def _qualname(fn: object) -> str:
    return str(getattr(fn, "__qualname__", type(fn).__name__))


def _per_key(
    param: str,
    value: object,
    dynamic: bool,
    check: Callable[[str, object], Any],
    default: Any,
) -> tuple[Any, PerCall | None]:
    """``value`` checked: (the fixed value, None), or for a limit per key (a callable, or a
    table for a template name) (its default, the :class:`~.bykey.PerCall`)."""
    if callable(value) and not isinstance(value, type):
        return default, PerCall(_qualname(value), fn=value)
    if not isinstance(value, Mapping):
        return check(param, value), None
    if not dynamic:
        raise TypeError(
            f"{param}={dict(value)!r} is not accepted for a fixed name: a table by key is for "
            f"a name template (e.g. 'llm:{{customer_id}}'); give {param} for this name alone"
        )
    checked: dict[str, Any] = {}
    for key, entry in value.items():
        checked[check_key(f"{param} (a table by key)", key)] = check(f"{param}[{key!r}]", entry)
    if DEFAULT not in checked:
        raise ValueError(
            f"{param}={dict(value)!r} is not accepted: a table by key needs a default entry "
            f"'*' (used for every name no other key matches), e.g. {{..., '*': 5}}"
        )
    keys = list(checked)
    shown = f"<table of {len(keys)}: {', '.join(map(repr, keys[:4]))}{', ...' * (len(keys) > 4)}>"
    table = Lookup(checked)
    return checked[DEFAULT], PerCall(shown, table=table)


def in_context(exc: Exception, prefix: str) -> Exception:
    """The TypeError or ValueError ``exc`` of a check, its message after ``prefix`` (the
    task and semaphore it is about)."""
    message = f"{prefix}{exc}"
    return TypeError(message) if isinstance(exc, TypeError) else ValueError(message)


def where_of(decorator: str, fun: Callable[..., Any]) -> str:
    """How errors name a decorated task function: ``@limited('api') on proj.tasks.charge``
    (the function's module and qualified name: Celery's default task name)."""
    module = getattr(fun, "__module__", None)
    qualname = getattr(fun, "__qualname__", None) or getattr(fun, "__name__", repr(fun))
    return f"{decorator} on {module}.{qualname}" if module else f"{decorator} on {qualname}"


def check_weight(where: str, name: str, weight: int, limit: int, source: str) -> None:
    """The one check that a run's ``weight`` fits its semaphore's ``limit`` (from ``source``),
    made at decoration, at worker start and per call; ``where``: the task or decorator."""
    if weight > limit:
        fix = "" if source == "limit=" else " or raise the limit"
        raise ValueError(
            f"{where}: weight={weight} exceeds the limit of semaphore {name!r} ({limit}, from "
            f"{source}); use a weight from 1 to {limit}{fix}"
        )


def check_rate_weight(where: str, name: str, weight: int, rates: tuple[Rate, ...]) -> None:
    """A run's ``weight`` counts as that many starts in every window: above a window's count
    it could never start."""
    smallest = min(rates, key=lambda r: r.count, default=None)
    if smallest is not None and weight > smallest.count:
        raise ValueError(
            f"{where}: weight={weight} exceeds the count of the rate window {smallest} of "
            f"semaphore {name!r}; a start counts its weight in every window: use a weight from "
            f"1 to {smallest.count} or a larger rate"
        )


def check_group_rates(where: str, name: str, rates: tuple[Rate, ...]) -> None:
    """``semaphore_rates`` may not give a rate to a semaphore a task takes with others."""
    if rates:
        raise ValueError(
            f"{where}: semaphore_rates gives semaphore {name!r} the rate "
            f"{[str(r) for r in rates]}, but the task takes several semaphores at once, and a "
            "group does not admit rates yet; remove that entry (or narrow its pattern)"
        )


def check_cap(
    where: str, name: str, weight: int, partition: str, cap: int | None, source: str
) -> None:
    """The one check that a run's ``weight`` fits the cap of its ``partition`` (from
    ``source``): a run above it would never be granted in that partition."""
    if cap is not None and weight > cap:
        raise ValueError(
            f"{where}: weight={weight} exceeds the cap of partition {partition!r} on "
            f"semaphore {name!r} ({cap}, from {source}); the run would never fit; use a "
            f"weight from 1 to {cap} or raise the cap"
        )


def _partition_rule(value: object) -> PartitionRule:
    if value is QUEUE or value is None:
        return value
    if callable(value):
        return value
    if isinstance(value, str):
        return Template.parse("partition", value)
    raise TypeError(
        f"partition must be a template str (e.g. '{{tenant_id}}'), a callable receiving the "
        f"bound arguments, or None (one line for all), got {type(value).__name__} {value!r}"
    )
