"""The settings table: one row per knob, with its default and the check of its value.

:data:`OPTIONS` are the task options, each also an app setting (``semaphore_<name>``);
:data:`APP_SETTINGS` exist at app level only.  What each one means is in the settings
reference (``docs/settings.md``), which a test keeps in step with this table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ..core import _validate, connection
from ..core.keys import validate_prefix
from ..core.rates import parse_rates
from .patterns import check_key

__all__ = [
    "APP_SETTINGS",
    "OPTIONS",
    "SPEC_OPTIONS",
    "Option",
    "check_bool",
    "check_heartbeat",
    "check_str",
    "queue_limits_map",
    "queue_weights_map",
]

_T = TypeVar("_T")
Check = Callable[[str, object], Any]

LEASE_LOST_POLICIES = ("log", "raise")
RESTART_POLICIES = ("fail_closed", "fail_open")
#: what a task does when its line is full (``max_waiting``)
ON_FULL = ("wait", "drop", "fail", "keep_newest")


def check_bool(param: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{param} must be True or False, got {type(value).__name__} {value!r}")
    return value


def check_queueing(
    priority: object, max_waiting: object, on_full: object, several: bool
) -> tuple[Any, int | None, str]:
    """``@limited``'s priority (an int 0-9 or a callable of the arguments), max_waiting and
    on_full, checked together."""
    if not callable(priority):
        priority = _validate.priority("priority", priority)
    most = _validate.optional_non_negative_int("max_waiting", max_waiting)
    policy = _one_of(ON_FULL)("on_full", on_full)
    if (most is None) != (policy == "wait"):
        raise ValueError(
            f"max_waiting={most!r} with on_full={policy!r} is not accepted: a bounded line "
            "needs a policy for when it is full, and a policy needs a bound: give "
            "max_waiting=N with on_full='drop', 'fail' or 'keep_newest', or neither"
        )
    if several and (callable(priority) or priority or most is not None):
        raise ValueError(
            "priority= and max_waiting= are not accepted on a task that takes several "
            "semaphores at once: their grants are made together, and a group has no "
            "priority or bounded line yet; put them on a task that takes one semaphore"
        )
    return priority, most, policy


def check_str(param: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{param} must be a str, got {type(value).__name__} {value!r}")
    return value


def _one_of(choices: tuple[str, ...]) -> Callable[[str, object], str]:
    def check(param: str, value: object) -> str:
        if value not in choices:
            raise ValueError(f"{param}={value!r} is not accepted: use one of {', '.join(choices)}")
        return str(value)

    return check


def _optional(check: Callable[[str, object], _T]) -> Callable[[str, object], _T | None]:
    """``check``, None let through."""
    return lambda param, value: None if value is None else check(param, value)


def _opt_count(param: str, value: object) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(
            f"{param} must be an int >= 0 or None, got {type(value).__name__} {value!r}"
        )
    return None if value is None else _validate.non_negative_int(param, value)


def _port(param: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError(
            f"{param}={value!r} is not accepted: use a TCP port (an int from 1 to 65535) or None"
        )
    return value


def _address(param: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(
            f"{param}={value!r} is not accepted: use an IP address or host name to listen "
            "on, e.g. '0.0.0.0' (all interfaces) or '127.0.0.1'"
        )
    return value


def _mapping(
    key_check: Callable[[str, object], str], what: str, check: Callable[[str, object], _T]
) -> Callable[[str, object], dict[str, _T] | None]:
    """The check of a dict setting or option: None, or a dict of ``what``: each key passes
    ``key_check``, each value ``check``."""

    def checked(param: str, value: object) -> dict[str, _T] | None:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise TypeError(
                f"{param} must be a dict of {what}, got {type(value).__name__} {value!r}"
            )
        return {key_check(param, k): check(f"{param}[{k!r}]", v) for k, v in value.items()}

    return checked


def _partition_key(param: str, key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(
            f"{param} keys must be partition (queue) names (str), got {type(key).__name__} {key!r}"
        )
    return key


#: ``{partition: cap}`` with caps ints >= 1, or None
queue_limits_map = _mapping(
    _partition_key, "partition (queue) name -> cap (int >= 1)", _validate.positive_int
)
#: ``{partition: weight}`` with weights ints from 1 to 1000, or None
queue_weights_map = _mapping(
    _partition_key,
    f"partition (queue) name -> weight (int from 1 to {_validate.MAX_PARTITION_WEIGHT})",
    lambda p, v: _validate.positive_int(p, v, maximum=_validate.MAX_PARTITION_WEIGHT),
)


def check_heartbeat(param: str, interval: float | None, lease_param: str, lease: float) -> None:
    """The heartbeat must refresh a lease before it runs out."""
    if interval is not None and interval >= lease:
        raise ValueError(
            f"{param}={interval!r} is not accepted with {lease_param}={lease!r}: the heartbeat "
            f"must refresh the lease before it expires; use a value below {lease} "
            f"(the default is a third of it)"
        )


@dataclass(frozen=True)
class Option:
    """One row of the settings table."""

    name: str  #: the task option (and, prefixed with ``semaphore_``, the app setting)
    default: Any
    check: Check

    @property
    def setting(self) -> str:
        return f"semaphore_{self.name}"


OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        Option("lease_ttl", 60.0, _validate.positive_seconds),
        Option("heartbeat_interval", None, _validate.optional_positive_seconds),
        Option("retry_backoff", 0.5, _validate.positive_seconds),
        Option("retry_backoff_max", 30.0, _validate.positive_seconds),
        Option("retry_jitter", True, check_bool),
        Option("max_wait", None, _validate.optional_non_negative_seconds),
        Option("slot_wait_timeout", 2.0, _validate.non_negative_seconds),
        Option("slot_waiters", None, _validate.optional_positive_int),
        Option("on_lease_lost", "log", _one_of(LEASE_LOST_POLICIES)),
    )
}

#: options of ``@limited`` that are not app settings (see :mod:`.spec`)
SPEC_OPTIONS = (
    "weight",
    "rate",
    "adaptive",
    "partition",
    "queue_limits",
    "queue_weights",
    "priority",
    "max_waiting",
    "on_full",
)


def _redis_url(param: str, value: object) -> str:
    return connection.validate_url(param, check_str(param, value), cluster=None)


def _by_name(what: str, check: Callable[[str, object], Any]) -> Check:
    """A per-semaphore setting: its keys are names, name templates or glob patterns."""
    return _mapping(check_key, f"semaphore name -> {what}", check)


def _per_partition(check: Callable[[str, object], dict[str, int] | None]) -> Check:
    return _by_name("{partition name -> int}", lambda p, v: check(p, v) or {})


#: app-level settings (no task option): default and check
APP_SETTINGS: dict[str, tuple[Any, Check]] = {
    "semaphore_redis_url": (None, _optional(_redis_url)),
    "semaphore_redis_cluster": (False, check_bool),
    "semaphore_redis_options": (None, _optional(connection.validate_options)),
    "semaphore_key_prefix": ("celery_semaphore", lambda p, v: validate_prefix(v)),
    "semaphore_hash_tag": (None, _optional(_validate.name)),
    "semaphore_limits": (None, _by_name("limit", _validate.positive_int)),
    "semaphore_rates": (None, _by_name("rate", parse_rates)),
    "semaphore_queue_limits": (None, _per_partition(queue_limits_map)),
    "semaphore_queue_weights": (None, _per_partition(queue_weights_map)),
    "semaphore_enabled": (True, check_bool),
    "semaphore_eager_timeout": (10.0, _validate.positive_seconds),
    "semaphore_worker_hold": (1000, _validate.non_negative_int),
    "semaphore_worker_standby": (None, _opt_count),
    "semaphore_restart_policy": ("fail_closed", _one_of(RESTART_POLICIES)),
    "semaphore_restart_quarantine": (None, _validate.optional_non_negative_seconds),
    "semaphore_metrics_port": (None, _optional(_port)),
    "semaphore_metrics_address": ("0.0.0.0", _address),
    "semaphore_metrics_page": (True, check_bool),
    "semaphore_registry_forget_after": (7 * 24 * 3600.0, _validate.optional_positive_seconds),
    "semaphore_priority_step": (60.0, _validate.non_negative_seconds),
    "semaphore_liveness_ttl": (3.0, _validate.optional_non_negative_seconds),
}
