"""What the settings give one task and one semaphore.

A task option resolves task option, then app setting, then default (:func:`resolve`).  A
per-semaphore setting (``semaphore_limits``, ``semaphore_rates``, ``semaphore_queue_limits``,
``semaphore_queue_weights``) applies under a semaphore's concrete name, then its name template,
then the most specific matching pattern (see :mod:`.patterns`), and beats what code gives.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from ..core.rates import Rate
from . import renames
from .memo import memo
from .patterns import Lookup
from .table import APP_SETTINGS, OPTIONS, Option, check_heartbeat

__all__ = [
    "ResolvedOptions",
    "configured_limit",
    "option_setting",
    "partition_cap",
    "partition_caps",
    "partition_weight",
    "resolve",
    "semaphore_limit",
    "semaphore_rates",
]


@dataclass(frozen=True)
class ResolvedOptions:
    lease_ttl: float
    heartbeat_interval: float
    retry_backoff: float
    retry_backoff_max: float
    retry_jitter: bool
    max_wait: float | None
    slot_wait_timeout: float
    slot_waiters: int | None
    on_lease_lost: str


def option_setting(conf: Any, opt: Option) -> Any:
    """The app setting of ``opt``, checked; a renamed setting is read under its old name too
    (both names with different values raise)."""
    given, value = renames.lookup(conf, opt.setting, opt.default)
    return opt.check(given, value)


def resolve(conf: Any, task_options: Mapping[str, Any]) -> ResolvedOptions:
    """Task option, then app setting, then default, for every row of the table."""
    try:
        key: Hashable = ("resolve", *sorted(task_options.items()))
        hash(key)
    except TypeError:  # an unhashable option value: nothing to remember it by
        return _resolve(conf, task_options)
    return memo(conf, key, lambda: _resolve(conf, task_options))


def _resolve(conf: Any, task_options: Mapping[str, Any]) -> ResolvedOptions:
    values = {
        name: task_options[name] if name in task_options else option_setting(conf, opt)
        for name, opt in OPTIONS.items()
    }
    if values["heartbeat_interval"] is None:
        values["heartbeat_interval"] = values["lease_ttl"] / 3
    check_heartbeat(
        "heartbeat_interval", values["heartbeat_interval"], "lease_ttl", values["lease_ttl"]
    )
    return ResolvedOptions(**values)


def _lookup(conf: Any, setting: str) -> Lookup[Any]:
    """The per-semaphore ``setting``, checked, ready to look names up in."""
    check = APP_SETTINGS[setting][1]
    return memo(conf, ("lookup", setting), lambda: Lookup(check(setting, conf.get(setting, None))))


def _names(name: str, template: str | None) -> tuple[str, ...]:
    return (name,) if template is None else (name, template)


def configured_limit(conf: Any, name: str, template: str | None = None) -> int | None:
    """The ``semaphore_limits`` entry that applies to ``name``: under the name itself, else
    under ``template`` (the name template of a dynamic name), else under the most specific
    matching pattern (see :mod:`.patterns`); None when no key applies."""
    found: int | None = _lookup(conf, "semaphore_limits").first(_names(name, template))
    return found


def semaphore_limit(conf: Any, name: str, code_limit: int, template: str | None = None) -> int:
    """:func:`configured_limit`, else the limit given in code."""
    found = configured_limit(conf, name, template)
    return code_limit if found is None else found


def semaphore_rates(
    conf: Any, name: str, code_rates: tuple[Rate, ...], template: str | None = None
) -> tuple[Rate, ...]:
    """The rate windows of ``name``: ``semaphore_rates`` under the name, its template or the
    most specific pattern (like ``semaphore_limits``), else those given in code."""
    found: tuple[Rate, ...] | None = _lookup(conf, "semaphore_rates").first(_names(name, template))
    return code_rates if found is None else found


def partition_cap(
    conf: Any, names: tuple[str, ...], code: Mapping[str, int], partition: str
) -> int | None:
    """The cap of ``partition`` on a semaphore: ``semaphore_queue_limits`` under its concrete
    name, then under its name template (``names``, in that order), then under the most
    specific matching pattern (see :mod:`.patterns`), then ``queue_limits=``."""
    for caps in _lookup(conf, "semaphore_queue_limits").candidates(names):
        if partition in caps:
            return caps[partition]  # type: ignore[no-any-return]
    return code.get(partition)


def partition_caps(conf: Any, names: tuple[str, ...], code: Mapping[str, int]) -> dict[str, int]:
    """Every partition cap of a semaphore: :func:`partition_cap` for each partition named."""
    out = dict(code)
    for caps in reversed(list(_lookup(conf, "semaphore_queue_limits").candidates(names))):
        out.update(caps)
    return out


def partition_weight(
    conf: Any, names: tuple[str, ...], code: Mapping[str, int], partition: str
) -> int:
    """The share weight of ``partition``: ``semaphore_queue_weights`` under the first of
    ``names`` that lists it, then under the most specific matching pattern, then
    ``queue_weights=``, else 1."""
    for weights in _lookup(conf, "semaphore_queue_weights").candidates(names):
        if partition in weights:
            return weights[partition]  # type: ignore[no-any-return]
    return code.get(partition, 1)
