"""The one place that turns settings into a redis-py client.

Three deployments, chosen by the URL scheme and one flag:

* one server: ``redis://[user:password@]host:port/db``, ``rediss://...`` (TLS) or
  ``unix:///path/to/socket?db=0``;
* Redis Cluster: the same ``redis://`` or ``rediss://`` URL of any node (or several, separated by
  ``;``, tried in turn) with ``cluster=True``; only database 0 exists there;
* Sentinel, written as Celery and kombu write it:
  ``sentinel://[:password@]host:26379/db;sentinel://host2:26379`` with ``master_name`` in the
  options (and ``sentinel_kwargs`` for the sentinels' own password or TLS).  The URL's password
  is the master's, as in kombu.

``options`` are redis-py connection keywords (TLS files, timeouts, ...), checked against
:data:`ACCEPTED_OPTIONS` so that a typo is an error, not a silently ignored key.  On top of
redis-py's defaults come :data:`WORKER_DEFAULTS`: short socket timeouts and few retries, so a
hung Redis costs a worker thread seconds, not minutes (redis-py 8 alone waits 5 s per try and
retries 10 times).  This module is part of the core: it imports redis-py, never Celery.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = [
    "ACCEPTED_OPTIONS",
    "SCHEMES",
    "WORKER_DEFAULTS",
    "connect_failure",
    "describe_client",
    "redis_client",
    "safe_url",
    "validate",
    "validate_options",
    "validate_url",
]

SCHEMES = ("redis", "rediss", "unix", "sentinel")

#: socket timeouts (seconds) and retries used unless ``options`` say otherwise
WORKER_DEFAULTS: dict[str, Any] = {
    "socket_timeout": 2.0,
    "socket_connect_timeout": 2.0,
    "health_check_interval": 30,
    "retries": 2,
}

_NUMBER_OPTIONS = ("socket_timeout", "socket_connect_timeout", "health_check_interval")
_FILE_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_CERT_REQS = ("none", "optional", "required")

#: option -> what it is; anything else is refused, naming these
ACCEPTED_OPTIONS: dict[str, str] = {
    "socket_timeout": "seconds > 0 a command may take (default 2.0)",
    "socket_connect_timeout": "seconds > 0 to connect (default 2.0)",
    "health_check_interval": "seconds >= 0 after which an idle connection is PINGed before use",
    "retries": "int >= 0: retries of a command after a connection error or timeout (default 2)",
    "retry_on_timeout": "bool (redis-py's own flag)",
    "socket_keepalive": "bool",
    "max_connections": "int >= 1 per process",
    "client_name": "str shown by CLIENT LIST",
    "username": "str (ACL user; or put it in the URL)",
    "password": "str (or put it in the URL)",
    "ssl": "bool (rediss:// sets it)",
    "ssl_ca_certs": "path of the CA bundle that signed the server's certificate",
    "ssl_certfile": "path of the client certificate (mutual TLS)",
    "ssl_keyfile": "path of the client certificate's key",
    "ssl_password": "str: password of the key file",
    "ssl_cert_reqs": "'none', 'optional' or 'required' (default)",
    "ssl_check_hostname": "bool",
    "ssl_ca_data": "str: PEM text of the CA bundle",
    "ssl_min_version": "an ssl.TLSVersion",
    "ssl_ciphers": "str",
    "protocol": "2 or 3 (RESP version)",
    "master_name": "str: the Sentinel service name (sentinel:// URLs only; required there)",
    "sentinel_kwargs": "dict of connection options for the sentinels themselves",
    "min_other_sentinels": "int >= 0 (sentinel:// URLs only)",
}
_SENTINEL_ONLY = ("master_name", "sentinel_kwargs", "min_other_sentinels")


def safe_url(url: str) -> str:
    """``url`` (each ``;``-separated part) with any password replaced by ``***``."""
    return ";".join(_safe_part(part) for part in url.split(";"))


def _safe_part(url: str) -> str:
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparsable URL>"
    if password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:  # IPv6
        host = f"[{host}]"
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def validate_url(param: str, url: object, *, cluster: bool | None = False) -> str:
    """Check a Redis URL (or a ``;``-separated list of them); return it unchanged.
    ``cluster=None``: not known yet (the checks that depend on it are left out)."""
    if not isinstance(url, str):
        raise TypeError(f"{param} must be a str, got {type(url).__name__}")
    accepted = ", ".join(f"{s}://" for s in SCHEMES)
    parts = [p.strip() for p in url.split(";")]
    schemes = []
    for part in parts:
        try:
            split = urlsplit(part)
            port = split.port
        except ValueError as exc:
            raise ValueError(f"{param}={safe_url(url)!r} is not accepted: {exc}") from None
        if split.scheme not in SCHEMES:
            raise ValueError(
                f"{param}={safe_url(url)!r} is not accepted: the URL scheme must be one of "
                f"{accepted}"
            )
        if split.scheme != "unix" and not split.hostname:
            raise ValueError(f"{param}={safe_url(url)!r} is not accepted: the URL has no host")
        del port
        schemes.append(split.scheme)
    if len(set(schemes)) > 1:
        raise ValueError(
            f"{param}={safe_url(url)!r} is not accepted: every ';'-separated URL must use "
            "the same scheme"
        )
    scheme = schemes[0]
    if cluster is None:
        return url
    if len(parts) > 1 and scheme != "sentinel" and not cluster:
        raise ValueError(
            f"{param}={safe_url(url)!r} is not accepted: several ';'-separated URLs are only "
            "for sentinel:// or a Redis Cluster (semaphore_redis_cluster=True)"
        )
    if cluster:
        if scheme not in ("redis", "rediss"):
            raise ValueError(
                f"{param}={safe_url(url)!r} is not accepted with a Redis Cluster: use "
                "redis:// or rediss:// URLs of cluster nodes"
            )
        for part in parts:
            db = urlsplit(part).path.strip("/")
            if db not in ("", "0"):
                raise ValueError(
                    f"{param}={safe_url(url)!r} is not accepted with a Redis Cluster: a cluster "
                    "has only database 0 (leave the path empty or use /0)"
                )
    return url


def validate_options(param: str, options: object, *, url: str | None = None) -> dict[str, Any]:
    """Check connection ``options``; return them as a plain dict."""
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise TypeError(
            f"{param} must be a dict of redis-py connection options, got {type(options).__name__}"
        )
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key not in ACCEPTED_OPTIONS:
            raise ValueError(
                f"{param} has an unknown key {key!r}; accepted: {', '.join(ACCEPTED_OPTIONS)}"
            )
        out[key] = _check_option(f"{param}[{key!r}]", key, value)
    sentinel = url is not None and urlsplit(url.split(";")[0].strip()).scheme == "sentinel"
    if url is not None and not sentinel:
        extra = [k for k in _SENTINEL_ONLY if k in out]
        if extra:
            raise ValueError(
                f"{param}: {', '.join(extra)} only apply to sentinel:// URLs, and the URL is "
                f"{safe_url(url)!r}"
            )
    if sentinel and not out.get("master_name"):
        raise ValueError(
            f"{param} must name the Sentinel service for a sentinel:// URL: add "
            "'master_name' (e.g. {'master_name': 'mymaster'})"
        )
    return out


def _check_option(param: str, key: str, value: object) -> Any:
    if key in _NUMBER_OPTIONS:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{param}={value!r} is not accepted: use a number of seconds >= 0")
        if value == 0 and key != "health_check_interval":
            raise ValueError(f"{param}={value!r} is not accepted: use a number of seconds > 0")
        return value
    if key in ("retries", "min_other_sentinels"):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{param}={value!r} is not accepted: use an int >= 0")
        return value
    if key == "max_connections":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{param}={value!r} is not accepted: use an int >= 1")
        return value
    if key in ("retry_on_timeout", "socket_keepalive", "ssl", "ssl_check_hostname"):
        if not isinstance(value, bool):
            raise ValueError(f"{param}={value!r} is not accepted: use True or False")
        return value
    if key in _FILE_OPTIONS:
        if not isinstance(value, str) or not value:
            raise ValueError(f"{param}={value!r} is not accepted: use the path of a file")
        if not os.path.isfile(value):
            raise ValueError(f"{param}={value!r} is not accepted: no such file")
        return value
    if key == "ssl_cert_reqs":
        if value not in _CERT_REQS:
            raise ValueError(
                f"{param}={value!r} is not accepted: use one of {', '.join(map(repr, _CERT_REQS))}"
            )
        return value
    if key == "protocol":
        if value not in (2, 3):
            raise ValueError(f"{param}={value!r} is not accepted: use 2 or 3")
        return value
    if key == "sentinel_kwargs":
        return validate_options(param, value)
    if key == "ssl_min_version":
        return value
    if not isinstance(value, str) or (key == "master_name" and not value):
        raise ValueError(f"{param}={value!r} is not accepted: use a non-empty str")
    return value


def validate(url: object, *, cluster: object = False, options: object = None) -> dict[str, Any]:
    """Check a whole connection configuration (as a worker does at start); return the
    options.  Errors name the settings ``semaphore_redis_url``, ``semaphore_redis_cluster``
    and ``semaphore_redis_options``."""
    if not isinstance(cluster, bool):
        raise TypeError(
            f"semaphore_redis_cluster must be True or False, got {type(cluster).__name__} "
            f"{cluster!r}"
        )
    checked = validate_url("semaphore_redis_url", url, cluster=cluster)
    return validate_options("semaphore_redis_options", options, url=checked)


def _retry(retries: int) -> Any:
    from redis.backoff import ExponentialWithJitterBackoff
    from redis.retry import Retry

    return Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), retries)


def _connection_kwargs(options: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {**WORKER_DEFAULTS, **overrides, **options}
    for key in _SENTINEL_ONLY:
        kwargs.pop(key, None)
    kwargs["retry"] = _retry(int(kwargs.pop("retries")))
    return kwargs


def redis_client(
    url: str,
    *,
    cluster: bool = False,
    options: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> Any:
    """A new redis-py client (``Redis``, ``RedisCluster``, or a Sentinel-managed ``Redis``
    following the current master) for ``url``.

    ``options`` (checked as a worker checks them at start) win over ``overrides``, which win over
    :data:`WORKER_DEFAULTS`.  Raises ValueError or TypeError for a bad configuration; nothing
    connects until the first command.
    """
    opts = validate(url, cluster=cluster, options=options)
    kwargs = _connection_kwargs(opts, overrides)
    parts = [p.strip() for p in url.split(";")]
    if urlsplit(parts[0]).scheme == "sentinel":
        return _sentinel_client(parts, opts, kwargs)
    if cluster:
        from redis.cluster import ClusterNode, RedisCluster

        seeds = [urlsplit(p) for p in parts[1:]]
        nodes = [ClusterNode(s.hostname, s.port or 6379) for s in seeds]  # type: ignore[no-untyped-call]
        if nodes:
            kwargs["startup_nodes"] = nodes
        return RedisCluster.from_url(parts[0], **kwargs)
    import redis

    return redis.Redis.from_url(parts[0], **kwargs)


def _sentinel_client(parts: list[str], opts: Mapping[str, Any], kwargs: dict[str, Any]) -> Any:
    from redis.sentinel import Sentinel

    first = urlsplit(parts[0])
    hosts = []
    for part in parts:
        split = urlsplit(part)
        hosts.append((split.hostname, split.port or 26379))
    db = first.path.strip("/")
    if db:
        if not db.isdigit():
            raise ValueError(
                f"semaphore_redis_url={safe_url(';'.join(parts))!r} is not accepted: the path "
                "must be a database number"
            )
        kwargs["db"] = int(db)
    # as in kombu: the URL's user and password are the master's
    if first.password is not None:
        kwargs.setdefault("password", unquote(first.password))
    if first.username:
        kwargs.setdefault("username", unquote(first.username))
    sentinel_kwargs = dict(opts.get("sentinel_kwargs") or {})
    for key in ("socket_timeout", "socket_connect_timeout"):
        sentinel_kwargs.setdefault(key, kwargs[key])
    if "retries" in sentinel_kwargs:
        sentinel_kwargs["retry"] = _retry(int(sentinel_kwargs.pop("retries")))
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        hosts,
        min_other_sentinels=int(opts.get("min_other_sentinels", 0)),
        sentinel_kwargs=sentinel_kwargs,
        **kwargs,
    )
    return sentinel.master_for(str(opts["master_name"]))  # type: ignore[no-untyped-call]


def describe_client(client: Any) -> str:
    """Where ``client`` points, for error messages, never with a password: a URL, ``Redis
    Cluster via host:port``, or ``Sentinel master 'name'``."""
    try:
        pool = getattr(client, "connection_pool", None)
        service = getattr(pool, "service_name", None)
        if service is not None:
            return f"Sentinel master {service!r}"
        if pool is None and hasattr(client, "get_nodes"):
            nodes = client.get_nodes()
            first = f"{nodes[0].host}:{nodes[0].port}" if nodes else "?"
            return f"Redis Cluster via {first}"
        kw = pool.connection_kwargs if pool is not None else {}
        if kw.get("path"):
            return f"unix://{kw['path']}?db={kw.get('db', 0)}"
        scheme = "rediss" if "SSL" in getattr(pool, "connection_class", type).__name__ else "redis"
        user = f"{kw['username']}@" if kw.get("username") else ""
        return f"{scheme}://{user}{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"
    except Exception:  # only ever used to word a message
        return "Redis"


def _is_config_error(exc: BaseException) -> bool:
    """Whether a failed PING means the settings are wrong (credentials, TLS), not that Redis
    is down for now."""
    from redis.exceptions import AuthenticationError, AuthorizationError, ResponseError

    if isinstance(exc, (AuthenticationError, AuthorizationError)):
        return True
    text = f"{exc} {exc.__cause__ or ''} {exc.__context__ or ''}"
    if isinstance(exc, ResponseError):
        return any(code in text for code in ("NOAUTH", "WRONGPASS", "NOPERM"))
    # a TLS failure shows as an ssl error, or (TLS 1.3: the server refuses a client
    # certificate after the handshake) as an EOF reported by the ssl module ("_ssl.c")
    lowered = text.lower()
    return "ssl" in lowered or "certificate" in lowered


def connect_failure(url: str, options: Mapping[str, Any] | None, exc: BaseException) -> str:
    """Why the first PING failed, in words: credentials refused, or Redis not reachable."""
    from redis.exceptions import AuthenticationError, AuthorizationError

    where = f"Redis at {safe_url(url)}"
    text = " ".join(str(exc).split())
    if isinstance(exc, AuthorizationError) or "NOPERM" in text:
        return (
            f"{where} accepted the credentials but refuses this user a command that "
            f"celery-semaphore needs ({text}); grant the ACL user the commands listed under "
            "'TLS and ACL' in the recipes"
        )
    if not isinstance(exc, AuthenticationError) and not any(
        code in text for code in ("NOAUTH", "WRONGPASS")
    ):
        return f"cannot reach {where}: {text}"
    try:
        password = urlsplit(url.split(";")[0]).password
    except ValueError:
        password = None
    if password or (options or {}).get("password"):
        return (
            f"{where} rejected the credentials ({text}): the server is reachable, but the user "
            "name or password is wrong; fix them in the Redis URL (semaphore_redis_url, or the "
            "result_backend or broker_url it falls back to) or in semaphore_redis_options"
        )
    return (
        f"{where} requires a password and none was given ({text}); put it in the URL "
        "(redis://:PASSWORD@host:6379/0, or redis://USER:PASSWORD@... with an ACL user)"
    )


def check(url: str, *, cluster: bool = False, options: Mapping[str, Any] | None = None) -> None:
    """PING the configured Redis once, as a worker does at start.

    Raises ValueError, naming the URL without its password, when the settings cannot work:
    wrong credentials or a TLS failure (an unknown CA, a wrong client certificate, TLS
    against a plain port).  When Redis is only unreachable, logs a warning and returns: the
    worker can start, and limited tasks fail (and retry) until Redis is back.
    """
    from redis.exceptions import RedisError

    from .. import logs

    log = logs.get("config")
    client: Any = None
    failure: RedisError | None = None
    try:
        client = redis_client(url, cluster=cluster, options=options, retries=0)
    except RedisError as exc:  # a cluster client talks to a node when it is made
        failure = exc
    try:
        if client is not None:
            client.ping()
    except RedisError as exc:
        failure = exc
    finally:
        if client is not None:
            client.close()
    if failure is None:
        return
    reason = " ".join(f"{type(failure).__name__}: {failure}".split())
    if _is_config_error(failure):
        from redis.exceptions import AuthenticationError, AuthorizationError

        text = f"{failure} {failure.__cause__ or ''}"
        if isinstance(failure, (AuthenticationError, AuthorizationError)) or any(
            code in text for code in ("NOAUTH", "WRONGPASS", "NOPERM")
        ):
            raise ValueError(connect_failure(url, options, failure)) from None
        raise ValueError(f"cannot use Redis at {safe_url(url)}: {reason}") from None
    log.warning(
        "celery-semaphore: Redis at %s is not reachable now (%s); limited tasks wait (held "
        "by the worker, or parked in the broker) until it answers: none runs without a permit",
        safe_url(url),
        reason,
        semaphore=None,
        task_id=None,
    )
