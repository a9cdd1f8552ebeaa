"""Where the semaphores' Redis is, from the settings: ``semaphore_redis_url`` (else a Redis
result backend, else a Redis broker), the cluster flag and the connection options; and the
Redis broker's ``visibility_timeout``, which the back-offs of parked tasks stay below."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..core import connection
from .memo import memo
from .table import check_bool, check_str

__all__ = [
    "DEFAULT_VISIBILITY_TIMEOUT",
    "RedisSettings",
    "redis_settings",
    "redis_url_for",
    "visibility_timeout",
]

#: kombu's visibility_timeout for the Redis transport, in seconds
DEFAULT_VISIBILITY_TIMEOUT = 3600

#: the URL schemes of a Celery broker or result backend that is Redis
_REDIS_SCHEMES = ("redis", "rediss", "sentinel")

#: where Celery keeps the transport options (master_name, ...) of its own Redis URLs
_TRANSPORT_OPTIONS = {
    "result_backend": "result_backend_transport_options",
    "broker_url": "broker_transport_options",
}


def redis_url_for(conf: Any) -> str:
    """``semaphore_redis_url``, else a redis(s):// or sentinel:// result backend, else such a
    broker."""
    return memo(conf, "redis_source", lambda: _redis_source(conf))[0]


def _redis_source(conf: Any) -> tuple[str, str | None]:
    """The URL, and the Celery setting it was taken from when it is not our own."""
    explicit = conf.get("semaphore_redis_url", None)
    if explicit:
        url = check_str("semaphore_redis_url", explicit)
        cluster = conf.get("semaphore_redis_cluster", False) is True
        return connection.validate_url("semaphore_redis_url", url, cluster=cluster), None
    for key in ("result_backend", "broker_url"):
        value = conf.get(key, None)
        scheme = urlsplit(value).scheme if isinstance(value, str) else None
        if scheme == "sentinel":
            return value, key
        if scheme in _REDIS_SCHEMES:
            return value.split(";")[0], key
    raise ValueError(
        "celery-semaphore needs Redis: set semaphore_redis_url (e.g. "
        "'redis://localhost:6379/0'); neither result_backend nor broker_url is a redis://, "
        f"rediss:// or sentinel:// URL (result_backend={_safe(conf.get('result_backend', None))}, "
        f"broker_url={_safe(conf.get('broker_url', None))})"
    )


def _safe(value: object) -> str:
    return repr(connection.safe_url(value)) if isinstance(value, str) else repr(value)


@dataclass(frozen=True)
class RedisSettings:
    """Everything :func:`celery_semaphore.core.connection.redis_client` needs, checked."""

    url: str
    cluster: bool
    options: dict[str, Any]


def redis_settings(conf: Any) -> RedisSettings:
    """The semaphores' Redis: URL, cluster flag and connection options, checked together.

    A sentinel:// URL taken from the result backend or broker brings that setting's
    ``master_name`` and ``sentinel_kwargs`` (from its transport options) unless
    ``semaphore_redis_options`` gives them.
    """
    url, source = _redis_source(conf)
    cluster = check_bool("semaphore_redis_cluster", conf.get("semaphore_redis_cluster", False))
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
    if not isinstance(broker, str) or urlsplit(broker).scheme not in _REDIS_SCHEMES:
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
