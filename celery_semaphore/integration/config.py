"""Settings and task options: one table, three levels.

Every knob has one row in :data:`OPTIONS`: the task option name (``@limited(..., name=value)``
or a ``semaphore_<name>`` attribute on a :class:`~celery_semaphore.LimitedTask`), the app setting
(``app.conf.semaphore_<name>``, lowercase; Django's ``CELERY_SEMAPHORE_<NAME>`` works through
Celery's namespace), the default, and a validator.  Resolution: task option, then app setting,
then default.  Settings are read lazily with ``app.conf.get`` (never ``add_defaults``, whose
values would beat ``config_from_object``) and validated at worker start.

Settings that only exist at app level: ``semaphore_redis_url``, ``semaphore_redis_cluster``,
``semaphore_redis_options``, ``semaphore_key_prefix``, ``semaphore_hash_tag``,
``semaphore_limits``, ``semaphore_queue_limits``, ``semaphore_queue_weights``,
``semaphore_enabled``, ``semaphore_eager_timeout``, ``semaphore_worker_hold``,
``semaphore_worker_standby``, ``semaphore_restart_policy``, ``semaphore_restart_quarantine``,
``semaphore_metrics_port``, ``semaphore_metrics_address``, ``semaphore_metrics_page``.

The keys of ``semaphore_limits``, ``semaphore_queue_limits`` and ``semaphore_queue_weights``
are exact names, name templates or glob patterns (which one wins: see
``celery_semaphore.integration.patterns``).
"""

from __future__ import annotations

import difflib
import threading
import weakref
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..core import _validate, connection
from ..core.keys import validate_prefix
from ..core.rates import Rate, parse_rates
from .patterns import Lookup, check_key

__all__ = [
    "APP_SETTINGS",
    "OPTIONS",
    "SPEC_OPTIONS",
    "Option",
    "RedisSettings",
    "ResolvedOptions",
    "configured_limit",
    "did_you_mean",
    "redis_settings",
    "redis_url_for",
    "resolve",
    "partition_cap",
    "partition_caps",
    "partition_weight",
    "queue_limits_map",
    "queue_weights_map",
    "semaphore_limit",
    "validate_app_settings",
    "validate_task_options",
]

LEASE_LOST_POLICIES = ("log", "raise")

_T = TypeVar("_T")

# -- memo: what the settings give, worked out once while they stay the same ----------------
#
# Celery's ``conf.get`` tries several spellings of a key through a chain of dicts (tens of
# microseconds each), and a limited task reads about thirty settings on its way through the
# gate and the body: on a 20 ms task that was a measurable share of a worker's CPU.  What is
# derived from the settings is kept per ``conf`` object, keyed also by the identity of every
# value in ``conf.changes`` (where ``conf.update`` and ``conf.x = ...`` write), so a change
# made through Celery's API is seen at once; ``config_from_object`` makes a new ``conf``.
# (A value mutated in place, e.g. ``conf.semaphore_limits["x"] = 3``, is not seen; assign a
# new dict.)  A plain mapping (no ``changes``) is never memoised.

_memo_lock = threading.Lock()
_memos: dict[int, tuple[weakref.ReferenceType[Any], tuple[int, ...], dict[Hashable, Any]]] = {}


def _generation(conf: Any) -> tuple[int, ...] | None:
    changes = getattr(conf, "changes", None)
    if not isinstance(changes, dict):
        return None
    return (len(changes), *map(id, changes.values()))


def memo(conf: Any, key: Hashable, compute: Callable[[], _T]) -> _T:
    """``compute()``, remembered for ``conf`` under ``key`` while its settings stay the same."""
    generation = _generation(conf)
    if generation is None:
        return compute()
    found = _memos.get(id(conf))
    if found is None or found[0]() is not conf or found[1] != generation:
        try:
            ref = weakref.ref(conf)
        except TypeError:
            return compute()
        found = (ref, generation, {})
        with _memo_lock:
            _memos[id(conf)] = found
            for dead in [k for k, v in _memos.items() if v[0]() is None]:
                del _memos[dead]
    table = found[2]
    try:
        return table[key]  # type: ignore[no-any-return]
    except KeyError:
        pass
    value = compute()
    table[key] = value
    return value


def setting(conf: Any, key: str, default: Any = None) -> Any:
    """``conf.get(key, default)``, memoised (see :func:`memo`)."""
    return memo(conf, ("get", key, default), lambda: conf.get(key, default))


def _bool(param: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{param} must be True or False, got {type(value).__name__} {value!r}")
    return value


def _policy(param: str, value: object) -> str:
    if value not in LEASE_LOST_POLICIES:
        raise ValueError(
            f"{param}={value!r} is not accepted: use one of {', '.join(LEASE_LOST_POLICIES)}"
        )
    return str(value)


def _count(param: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{param} must be an int >= 0, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{param}={value!r} is not accepted: use an int >= 0")
    return value


def _opt_count(param: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{param} must be an int >= 0 or None, got {type(value).__name__} {value!r}"
        )
    return _count(param, value)


def _opt_int(param: str, value: object) -> int | None:
    return None if value is None else _validate.positive_int(param, value)


def _opt_seconds_nonneg(param: str, value: object) -> float | None:
    return _validate.optional_non_negative_seconds(param, value)


@dataclass(frozen=True)
class Option:
    """One row of the settings table."""

    name: str  #: the task option (and, prefixed with ``semaphore_``, the app setting)
    default: Any
    check: Callable[[str, object], Any]
    doc: str

    @property
    def setting(self) -> str:
        return f"semaphore_{self.name}"


OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        Option(
            "lease_ttl",
            60.0,
            _validate.positive_seconds,
            "Seconds a permit lasts unless refreshed by the heartbeat.",
        ),
        Option(
            "heartbeat_interval",
            None,
            _validate.optional_positive_seconds,
            "Seconds between lease refreshes; None means lease_ttl / 3.",
        ),
        Option(
            "retry_backoff",
            0.5,
            _validate.positive_seconds,
            "First back-off (seconds) when a task parks without a permit.",
        ),
        Option(
            "retry_backoff_max",
            30.0,
            _validate.positive_seconds,
            "Cap of the back-off; always kept below half the Redis broker's visibility_timeout.",
        ),
        Option(
            "retry_jitter",
            True,
            _bool,
            "Full jitter: each back-off is uniform in [0, backoff] rather than exactly backoff.",
        ),
        Option(
            "max_wait",
            None,
            _opt_seconds_nonneg,
            "Seconds a task may wait for a permit in all, then it fails with SemaphoreTimeout; "
            "None waits forever.",
        ),
        Option(
            "wait_timeout",
            2.0,
            _validate.non_negative_seconds,
            "Seconds a task near the head of the line waits in its worker slot before parking.",
        ),
        Option(
            "standby",
            None,
            _opt_int,
            "How many waiters at the head of the line wait in their worker slot (the rest "
            "park and free the slot); None means equal to the limit.",
        ),
        Option(
            "on_lease_lost",
            "log",
            _policy,
            "'log': log an error when the heartbeat finds the permit lost; 'raise': also raise "
            "LeaseLost at the next celery_semaphore.checkpoint() in the task.",
        ),
    )
}

#: app-level settings (no task option), with default and validator
APP_SETTINGS: dict[str, tuple[Any, Callable[[str, object], Any], str]] = {
    "semaphore_redis_url": (
        None,
        lambda p, v: None if v is None else connection.validate_url(p, _str(p, v), cluster=None),
        "Redis for the semaphores (redis://, rediss://, unix:// or sentinel:// URL); default: a "
        "redis(s):// or sentinel:// result backend, else such a broker.",
    ),
    "semaphore_redis_cluster": (
        False,
        _bool,
        "True: semaphore_redis_url names node(s) of a Redis Cluster.",
    ),
    "semaphore_redis_options": (
        None,
        lambda p, v: None if v is None else connection.validate_options(p, v),
        "Dict of redis-py connection options: TLS files, timeouts, retries; for sentinel:// "
        "also master_name and sentinel_kwargs.",
    ),
    "semaphore_key_prefix": (
        "celery_semaphore",
        lambda p, v: validate_prefix(v),
        "First part of every Redis key.",
    ),
    "semaphore_hash_tag": (
        None,
        lambda p, v: None if v is None else _validate.name(p, v),
        "Put every semaphore's keys in the Redis Cluster slot of this one hash tag (needed for "
        "several semaphores per task on a Redis Cluster); None gives each semaphore its own.",
    ),
    "semaphore_limits": (
        None,
        lambda p, v: _limits(p, v),
        "Dict of semaphore name (or name template, or glob pattern such as 'llm:*') -> "
        "limit, overriding the limit given in code.",
    ),
    "semaphore_rates": (
        None,
        lambda p, v: _rates_setting(p, v),
        "Dict of semaphore name (or name template, or glob pattern) -> rate ('100/s', a list "
        "of windows such as ['60/m', '1000/h'], or None for no rate), overriding rate= in code.",
    ),
    "semaphore_queue_limits": (
        None,
        lambda p, v: _per_semaphore(p, v, queue_limits_map),
        "Dict of semaphore name (or name template, or glob pattern) -> {partition (queue) "
        "name -> cap}: the most units one partition may hold; overrides queue_limits= in "
        "code, key by key.",
    ),
    "semaphore_queue_weights": (
        None,
        lambda p, v: _per_semaphore(p, v, queue_weights_map),
        "Dict of semaphore name (or name template, or glob pattern) -> {partition (queue) "
        "name -> weight from 1 to 1000}: the partition's share of the limit while several "
        "wait; overrides queue_weights= in code.",
    ),
    "semaphore_enabled": (
        True,
        _bool,
        "False runs limited tasks without acquiring anything (e.g. in tests).",
    ),
    "semaphore_eager_timeout": (
        10.0,
        _validate.positive_seconds,
        "Seconds an eager or direct call blocks for a permit before SemaphoreTimeout "
        "(semaphore_max_wait wins when set).",
    ),
    "semaphore_worker_hold": (
        1000,
        _count,
        "How many waiting limited tasks one worker node holds in its consumer, off the pool, "
        "until a release wakes them; 0 turns the gate off (tasks wait in their slot or park).",
    ),
    "semaphore_worker_standby": (
        None,
        _opt_count,
        "How many of the tasks a worker's gate holds, per semaphore, it sends ahead into free "
        "pool slots, where the release that frees their units grants them in the slot (one "
        "hop instead of three on prefork); only while the semaphore turns over on that worker "
        "and the pool keeps a slot free; 0 turns standby off; None: 2 on the prefork pool, 0 "
        "on the others (whose gate hands a grant to the pool in the same process).",
    ),
    "semaphore_restart_policy": (
        "fail_closed",
        lambda p, v: _restart_policy(p, v),
        "What a worker does when it finds that Redis lost a semaphore's state (a restart "
        "without persistence, a failover, a flush) while tasks ran: 'fail_closed' grants no "
        "new permit for semaphore_restart_quarantine seconds while running tasks re-assert "
        "theirs; 'fail_open' grants at once (up to limit more bodies until the old ones end).",
    ),
    "semaphore_restart_quarantine": (
        None,
        _opt_seconds_nonneg,
        "Seconds without new permits after a lost state (fail_closed); None means the "
        "semaphore's lease_ttl (every running body has re-asserted its permit by then).",
    ),
    "semaphore_metrics_port": (
        None,
        lambda p, v: _port(p, v),
        "Port on which each worker's main process serves Prometheus metrics (needs the "
        "[prometheus] extra); None serves none.",
    ),
    "semaphore_metrics_address": (
        "0.0.0.0",
        lambda p, v: _address(p, v),
        "Address the metrics exporter listens on.",
    ),
    "semaphore_metrics_page": (
        True,
        _bool,
        "Also serve the read-only operator page (celery semaphore serve's) on the metrics "
        "port; False serves /metrics alone.",
    ),
}


RESTART_POLICIES = ("fail_closed", "fail_open")


def _restart_policy(param: str, value: object) -> str:
    if value not in RESTART_POLICIES:
        raise ValueError(
            f"{param}={value!r} is not accepted: use one of {', '.join(RESTART_POLICIES)}"
        )
    return str(value)


def _port(param: str, value: object) -> int | None:
    if value is None:
        return None
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


def _str(param: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{param} must be a str, got {type(value).__name__} {value!r}")
    return value


def _limits(param: str, value: object) -> dict[str, int] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{param} must be a dict of semaphore name -> limit, got {type(value).__name__} "
            f"{value!r}"
        )
    return {
        check_key(param, k): _validate.positive_int(f"{param}[{k!r}]", v) for k, v in value.items()
    }


def _rates_setting(param: str, value: object) -> dict[str, tuple[Rate, ...]] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{param} must be a dict of semaphore name -> rate, got {type(value).__name__} "
            f"{value!r}"
        )
    return {check_key(param, k): parse_rates(f"{param}[{k!r}]", v) for k, v in value.items()}


#: options of ``@limited`` that are not app settings (see :mod:`.spec`)
SPEC_OPTIONS = ("weight", "rate", "adaptive", "partition", "queue_limits", "queue_weights")

#: the largest partition weight the core accepts
MAX_PARTITION_WEIGHT = _validate.MAX_PARTITION_WEIGHT


def _partition_map(
    param: str, value: object, check: Callable[[str, object], int], what: str
) -> dict[str, int] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{param} must be a dict of partition (queue) name -> {what}, got "
            f"{type(value).__name__} {value!r}"
        )
    out: dict[str, int] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise TypeError(
                f"{param} keys must be partition (queue) names (str), got "
                f"{type(key).__name__} {key!r}"
            )
        out[key] = check(f"{param}[{key!r}]", item)
    return out


def queue_limits_map(param: str, value: object) -> dict[str, int] | None:
    """``{partition: cap}`` with caps ints >= 1, or None."""
    return _partition_map(param, value, _validate.positive_int, "cap (int >= 1)")


def queue_weights_map(param: str, value: object) -> dict[str, int] | None:
    """``{partition: weight}`` with weights ints from 1 to 1000, or None."""

    def weight(p: str, v: object) -> int:
        return _validate.positive_int(p, v, maximum=MAX_PARTITION_WEIGHT)

    return _partition_map(param, value, weight, f"weight (int from 1 to {MAX_PARTITION_WEIGHT})")


def _per_semaphore(
    param: str, value: object, check: Callable[[str, object], dict[str, int] | None]
) -> dict[str, dict[str, int]] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{param} must be a dict of semaphore name -> {{partition name -> int}}, got "
            f"{type(value).__name__} {value!r}"
        )
    out: dict[str, dict[str, int]] = {}
    for name, inner in value.items():
        check_key(param, name)
        out[name] = check(f"{param}[{name!r}]", inner) or {}
    return out


def _queue_limits(conf: Any) -> Lookup[dict[str, int]]:
    return memo(
        conf,
        "queue_limits",
        lambda: Lookup(
            _per_semaphore(
                "semaphore_queue_limits", conf.get("semaphore_queue_limits", None), queue_limits_map
            )
        ),
    )


def _queue_weights(conf: Any) -> Lookup[dict[str, int]]:
    return memo(
        conf,
        "queue_weights",
        lambda: Lookup(
            _per_semaphore(
                "semaphore_queue_weights",
                conf.get("semaphore_queue_weights", None),
                queue_weights_map,
            )
        ),
    )


def partition_cap(
    conf: Any, names: tuple[str, ...], code: Mapping[str, int], partition: str
) -> int | None:
    """The cap of ``partition`` on a semaphore: ``semaphore_queue_limits`` under its concrete
    name, then under its name template (``names``, in that order), then under the most
    specific matching pattern (see :mod:`.patterns`), then ``queue_limits=``."""
    for caps in _queue_limits(conf).candidates(names):
        if partition in caps:
            return caps[partition]
    return code.get(partition)


def partition_caps(conf: Any, names: tuple[str, ...], code: Mapping[str, int]) -> dict[str, int]:
    """Every partition cap of a semaphore: :func:`partition_cap` for each partition named."""
    out = dict(code)
    for caps in reversed(list(_queue_limits(conf).candidates(names))):
        out.update(caps)
    return out


def partition_weight(
    conf: Any, names: tuple[str, ...], code: Mapping[str, int], partition: str
) -> int:
    """The share weight of ``partition``: ``semaphore_queue_weights`` under the first of
    ``names`` that lists it, then under the most specific matching pattern, then
    ``queue_weights=``, else 1."""
    for weights in _queue_weights(conf).candidates(names):
        if partition in weights:
            return weights[partition]
    return code.get(partition, 1)


def validate_task_options(options: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """Check options given in code; unknown names are an error naming the known ones."""
    unknown = sorted(set(options) - set(OPTIONS) - {"weight"})
    if unknown:
        raise TypeError(
            f"{where}: unknown option(s) {', '.join(unknown)}; accepted: "
            f"{', '.join(sorted([*OPTIONS, *SPEC_OPTIONS]))}"
        )
    checked: dict[str, Any] = {}
    for key, value in options.items():
        if key == "weight":
            checked[key] = _validate.positive_int("weight", value)
        else:
            checked[key] = OPTIONS[key].check(key, value)
    return checked


def validate_app_settings(conf: Any, namespace: str | None = None) -> dict[str, Any]:
    """Validate every ``semaphore_*`` setting present in ``conf``; raise on the first bad one.

    Also rejects unknown ``semaphore_*`` keys (a typo would otherwise be silently ignored),
    including Django-style ``<NAMESPACE>_SEMAPHORE_*`` keys when the app has a namespace.
    """
    known = set(APP_SETTINGS) | {o.setting for o in OPTIONS.values()}
    strip = f"{namespace.lower()}_" if namespace else ""
    unknown = []
    for key in conf:
        if not isinstance(key, str):
            continue
        name = key.lower()
        if strip and name.startswith(strip):
            name = name[len(strip) :]
        if name.startswith("semaphore_") and name not in known:
            unknown.append(key)
    unknown.sort()
    if unknown:
        raise ValueError(
            f"unknown setting(s) {', '.join(_with_guess(k, known, strip) for k in unknown)}; "
            f"celery-semaphore accepts: {', '.join(sorted(known))}"
        )
    out: dict[str, Any] = {}
    for key, (default, check, _doc) in APP_SETTINGS.items():
        out[key] = check(key, conf.get(key, default))
    for opt in OPTIONS.values():
        out[opt.setting] = opt.check(opt.setting, conf.get(opt.setting, opt.default))
    if out["semaphore_redis_url"] is not None:
        connection.validate(
            out["semaphore_redis_url"],
            cluster=out["semaphore_redis_cluster"],
            options=out["semaphore_redis_options"],
        )
    check_heartbeat(
        "semaphore_heartbeat_interval",
        out["semaphore_heartbeat_interval"],
        "semaphore_lease_ttl",
        out["semaphore_lease_ttl"],
    )
    visibility_timeout(conf)  # the back-offs are kept below it: a bad one fails here, at start
    return out


def _with_guess(key: str, known: set[str], strip: str) -> str:
    """``key``, and the known setting it was probably meant to be (a typo)."""
    name = key.lower()
    if strip and name.startswith(strip):
        name = name[len(strip) :]
    guess = did_you_mean(name, known, cutoff=0.8)
    if guess is None:
        return key
    if key != key.lower():  # keep the spelling of the namespace (CELERY_SEMAPHORE_...)
        guess = (key[: len(key) - len(name)] + guess).upper()
    return f"{key} (did you mean {guess}?)"


def did_you_mean(word: str, known: Iterable[str], cutoff: float = 0.8) -> str | None:
    """The one of ``known`` that ``word`` was probably meant to be (a typo), or None."""
    close = difflib.get_close_matches(word, sorted(set(known)), n=1, cutoff=cutoff)
    return close[0] if close else None


def check_heartbeat(param: str, interval: float | None, lease_param: str, lease: float) -> None:
    """The heartbeat must refresh a lease before it runs out."""
    if interval is not None and interval >= lease:
        raise ValueError(
            f"{param}={interval!r} is not accepted with {lease_param}={lease!r}: the heartbeat "
            f"must refresh the lease before it expires; use a value below {lease} "
            f"(the default is a third of it)"
        )


@dataclass(frozen=True)
class ResolvedOptions:
    lease_ttl: float
    heartbeat_interval: float
    retry_backoff: float
    retry_backoff_max: float
    retry_jitter: bool
    max_wait: float | None
    wait_timeout: float
    standby: int | None
    on_lease_lost: str


def resolve(conf: Any, task_options: Mapping[str, Any]) -> ResolvedOptions:
    """Task option, then app setting, then default, for every row of the table."""
    try:
        key: Hashable = ("resolve", *sorted(task_options.items()))
        hash(key)
    except TypeError:  # an unhashable option value: nothing to remember it by
        return _resolve(conf, task_options)
    return memo(conf, key, lambda: _resolve(conf, task_options))


def _resolve(conf: Any, task_options: Mapping[str, Any]) -> ResolvedOptions:
    values: dict[str, Any] = {}
    for opt in OPTIONS.values():
        if opt.name in task_options:
            values[opt.name] = task_options[opt.name]
        else:
            values[opt.name] = opt.check(opt.setting, conf.get(opt.setting, opt.default))
    if values["heartbeat_interval"] is None:
        values["heartbeat_interval"] = values["lease_ttl"] / 3
    check_heartbeat(
        "heartbeat_interval", values["heartbeat_interval"], "lease_ttl", values["lease_ttl"]
    )
    return ResolvedOptions(**values)


def _limits_lookup(conf: Any) -> Lookup[int]:
    return memo(
        conf,
        "limits",
        lambda: Lookup(_limits("semaphore_limits", conf.get("semaphore_limits", None))),
    )


def configured_limit(conf: Any, name: str, template: str | None = None) -> int | None:
    """The ``semaphore_limits`` entry that applies to ``name``: under the name itself, else
    under ``template`` (the name template of a dynamic name), else under the most specific
    matching pattern (see :mod:`.patterns`); None when no key applies."""
    lookup = _limits_lookup(conf)
    if not lookup:
        return None
    return lookup.first((name,) if template is None else (name, template))


def semaphore_rates(
    conf: Any, name: str, code_rates: tuple[Rate, ...], template: str | None = None
) -> tuple[Rate, ...]:
    """The rate windows of ``name``: ``semaphore_rates`` under the name, its template or the
    most specific pattern (like ``semaphore_limits``), else those given in code."""
    lookup: Lookup[tuple[Rate, ...]] = memo(
        conf,
        "rates",
        lambda: Lookup(_rates_setting("semaphore_rates", conf.get("semaphore_rates", None))),
    )
    if not lookup:
        return code_rates
    found = lookup.first((name,) if template is None else (name, template))
    return code_rates if found is None else found


def semaphore_limit(conf: Any, name: str, code_limit: int, template: str | None = None) -> int:
    """``semaphore_limits[name]`` when configured, else ``semaphore_limits[template]`` (the
    name template of a dynamic name), else the most specific pattern matching either, else
    the limit given in code."""
    found = configured_limit(conf, name, template)
    return code_limit if found is None else found


def redis_url_for(conf: Any) -> str:
    """``semaphore_redis_url``, else a redis(s):// or sentinel:// result backend, else such a
    broker."""
    return memo(conf, "redis_source", lambda: _redis_source(conf))[0]


_FALLBACK_SCHEMES = ("redis", "rediss", "sentinel")


def _redis_source(conf: Any) -> tuple[str, str | None]:
    """The URL, and the Celery setting it was taken from when it is not our own."""
    explicit = conf.get("semaphore_redis_url", None)
    if explicit:
        url = _str("semaphore_redis_url", explicit)
        cluster = conf.get("semaphore_redis_cluster", False) is True
        return connection.validate_url("semaphore_redis_url", url, cluster=cluster), None
    for key in ("result_backend", "broker_url"):
        value = conf.get(key, None)
        if isinstance(value, str) and urlsplit(value).scheme in _FALLBACK_SCHEMES:
            if urlsplit(value).scheme == "sentinel":
                return value, key
            return value.split(";")[0], key
    raise ValueError(
        "celery-semaphore needs Redis: set semaphore_redis_url (e.g. "
        "'redis://localhost:6379/0'); neither result_backend nor broker_url is a redis://, "
        f"rediss:// or sentinel:// URL (result_backend={_safe(conf.get('result_backend', None))}, "
        f"broker_url={_safe(conf.get('broker_url', None))})"
    )


def _safe(value: object) -> str:
    return repr(connection.safe_url(value)) if isinstance(value, str) else repr(value)


#: where Celery keeps the transport options (master_name, ...) of its own Redis URLs
_TRANSPORT_OPTIONS = {
    "result_backend": "result_backend_transport_options",
    "broker_url": "broker_transport_options",
}


@dataclass(frozen=True)
class RedisSettings:
    """Everything :func:`celery_semaphore.core.connection.redis_client` needs, checked."""

    url: str
    cluster: bool
    options: dict[str, Any]

    def cache_key(self) -> tuple[Any, ...]:
        return (self.url, self.cluster, repr(sorted(self.options.items())))


def redis_settings(conf: Any) -> RedisSettings:
    """The semaphores' Redis: URL, cluster flag and connection options, checked together.

    A sentinel:// URL taken from the result backend or broker brings that setting's
    ``master_name`` and ``sentinel_kwargs`` (from its transport options) unless
    ``semaphore_redis_options`` gives them.
    """
    url, source = _redis_source(conf)
    cluster = _bool("semaphore_redis_cluster", conf.get("semaphore_redis_cluster", False))
    raw = conf.get("semaphore_redis_options", None)
    options = dict(connection.validate_options("semaphore_redis_options", raw))
    if source is not None and urlsplit(url).scheme == "sentinel":
        transport = conf.get(_TRANSPORT_OPTIONS[source], None) or {}
        for key in ("master_name", "sentinel_kwargs"):
            if key not in options and transport.get(key):
                options[key] = transport[key]
    checked = connection.validate(url, cluster=cluster, options=options)
    return RedisSettings(url, cluster, checked)


def visibility_timeout(conf: Any) -> float | None:
    """The Redis broker's visibility_timeout, or None when the broker is not Redis."""
    broker = conf.get("broker_url", None) or ""
    if not isinstance(broker, str) or urlsplit(broker).scheme not in (
        "redis",
        "rediss",
        "sentinel",
    ):
        return None
    options = conf.get("broker_transport_options", None) or {}
    if not isinstance(options, Mapping):
        raise TypeError(
            f"broker_transport_options must be a dict, got {type(options).__name__} {options!r}"
        )
    value = options.get("visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        # kombu uses the value as it is (time() - visibility_timeout): a str breaks it too
        raise ValueError(
            f"broker_transport_options['visibility_timeout']={value!r} is not accepted: use "
            "a number of seconds > 0 (how long the Redis broker waits before it delivers an "
            f"unacknowledged message again; kombu's default is {DEFAULT_VISIBILITY_TIMEOUT})"
        )
    return float(value)


#: kombu's visibility_timeout for the Redis transport, in seconds
DEFAULT_VISIBILITY_TIMEOUT = 3600
