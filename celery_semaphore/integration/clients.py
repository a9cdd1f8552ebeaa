"""This process's redis-py clients: one per Redis URL and app settings, made lazily (so a
prefork child makes its own after the fork), with the app's cluster flag and client options.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ..core import connection
from . import config

__all__ = ["client_for"]

_lock = threading.Lock()

_clients: dict[tuple[int, str, int], Any] = {}


def client_for(url: str, conf: Any = None) -> Any:
    """This process's redis-py client for ``url`` (one connection pool per process), made by
    :mod:`celery_semaphore.core.connection` with ``conf``'s ``semaphore_redis_cluster`` and
    ``semaphore_redis_options``."""
    key = (os.getpid(), url, id(conf))
    with _lock:
        client = _clients.get(key)
        if client is None:
            if conf is None:
                client = connection.redis_client(url)
            else:
                s = config.redis_settings(conf)
                client = connection.redis_client(s.url, cluster=s.cluster, options=s.options)
            _clients[key] = client
        return client
