"""Settings and task options: one table, three levels.

Every knob has one row in :data:`OPTIONS` (see :mod:`.table`): the task option name
(``@limited(..., name=value)`` or a ``semaphore_<name>`` attribute on a
:class:`~celery_semaphore.LimitedTask`), the app setting (``app.conf.semaphore_<name>``,
lowercase; Django's ``CELERY_SEMAPHORE_<NAME>`` works through Celery's namespace), the default,
and a check.  Resolution (:mod:`.resolution`): task option, then app setting, then default.
Settings are read lazily with ``app.conf.get`` (never ``add_defaults``, whose values would beat
``config_from_object``), remembered while they stay the same (:mod:`.memo`), and validated at
worker start (:func:`validate_app_settings`).  Renamed settings and options (:mod:`.renames`)
are still read under their old names, with a warning.

Settings that only exist at app level are :data:`APP_SETTINGS`; the Redis ones are read by
:mod:`.redisconf`.  The keys of ``semaphore_limits``, ``semaphore_rates``,
``semaphore_queue_limits`` and ``semaphore_queue_weights`` are exact names, name templates or
glob patterns (which one wins: see :mod:`.patterns`).

This module is where the rest of the package finds all of it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from ..core import _validate, connection
from . import renames
from .memo import memo, setting
from .redisconf import redis_settings, redis_url_for, visibility_timeout
from .resolution import (
    ResolvedOptions,
    configured_limit,
    option_setting,
    partition_cap,
    partition_caps,
    partition_weight,
    resolve,
    semaphore_limit,
    semaphore_rates,
)
from .table import APP_SETTINGS, OPTIONS, SPEC_OPTIONS, Option, check_heartbeat

__all__ = [
    "APP_SETTINGS",
    "OPTIONS",
    "SPEC_OPTIONS",
    "Option",
    "ResolvedOptions",
    "configured_limit",
    "did_you_mean",
    "memo",
    "partition_cap",
    "partition_caps",
    "partition_weight",
    "redis_settings",
    "redis_url_for",
    "resolve",
    "semaphore_limit",
    "semaphore_rates",
    "setting",
    "validate_app_settings",
    "validate_task_options",
    "visibility_timeout",
]


def validate_task_options(options: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """Check options given in code; unknown names are an error naming the known ones, an old
    name (see :mod:`.renames`) is taken as the new one, with a warning."""
    unknown = sorted(set(options) - set(OPTIONS) - set(renames.RENAMED_OPTIONS) - {"weight"})
    if unknown:
        raise TypeError(
            f"{where}: unknown option(s) {', '.join(unknown)}; accepted: "
            f"{', '.join(sorted([*OPTIONS, *SPEC_OPTIONS]))}"
        )
    checked: dict[str, Any] = {}
    for key, value in options.items():  # a bad value is named as it was given
        if key == "weight":
            checked[key] = _validate.positive_int("weight", value)
        else:
            checked[key] = OPTIONS[renames.RENAMED_OPTIONS.get(key, key)].check(key, value)
    renames.task_options(options, where=where)  # both names given? a warning for an old one
    return {renames.RENAMED_OPTIONS.get(k, k): v for k, v in checked.items()}


def validate_app_settings(conf: Any, namespace: str | None = None) -> dict[str, Any]:
    """Validate every ``semaphore_*`` setting present in ``conf``; raise on the first bad one.

    Also rejects unknown ``semaphore_*`` keys (a typo would otherwise be silently ignored),
    including Django-style ``<NAMESPACE>_SEMAPHORE_*`` keys when the app has a namespace.
    """
    _reject_unknown(conf, f"{namespace.lower()}_" if namespace else "")
    out = {
        key: check(key, conf.get(key, default)) for key, (default, check) in APP_SETTINGS.items()
    }
    out.update({opt.setting: option_setting(conf, opt) for opt in OPTIONS.values()})
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


def _bare(key: str, namespace: str) -> str:
    """``key`` in lowercase, without the ``namespace`` prefix (``celery_``) it may have."""
    name = key.lower()
    return name[len(namespace) :] if namespace and name.startswith(namespace) else name


def _reject_unknown(conf: Any, namespace: str) -> None:
    current = set(APP_SETTINGS) | {o.setting for o in OPTIONS.values()}
    known = current | set(renames.RENAMED_SETTINGS)
    unknown = sorted(
        key
        for key in conf
        if isinstance(key, str)
        and _bare(key, namespace).startswith("semaphore_")
        and _bare(key, namespace) not in known
    )
    if unknown:
        raise ValueError(
            f"unknown setting(s) {', '.join(_with_guess(k, current, namespace) for k in unknown)}"
            f"; celery-semaphore accepts: {', '.join(sorted(current))}"
        )


def _with_guess(key: str, known: set[str], namespace: str) -> str:
    """``key``, and the known setting it was probably meant to be (a typo)."""
    name = _bare(key, namespace)
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
