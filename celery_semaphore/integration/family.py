"""One liveness record per worker *family*: the worker's main process writes it and keeps it
refreshed; its pool children use the same record (:func:`celery_semaphore.core.liveness.adopt`).

A child dies with its worker (Celery's pool children get SIGKILL when their parent dies), and a
child that dies alone is reclaimed by its worker at once (:mod:`.signals`), so a child needs no
record of its own -- and a body that holds the GIL in a child for longer than the record lives
cannot lose its permit for it: the record is refreshed by the main process, not by a thread of
the child.  ``semaphore_liveness_ttl`` (seconds, default 3; 0 or None: off, the leases alone);
off on a Redis Cluster (see ``docs/concepts.md``, "Liveness").
"""

from __future__ import annotations

from typing import Any

from celery import signals

from ..core import liveness
from . import config
from .clients import client_for

__all__ = ["DEFAULT_TTL", "liveness_ttl", "start"]

DEFAULT_TTL = 3.0
#: the worker's ident, for its pool children (None: no family record in this worker)
_family: str | None = None
#: the family's record is refreshed while this handle lives (kept here for the worker's life)
_record: object = None


def liveness_ttl(conf: Any) -> float | None:
    """The liveness TTL of ``conf``'s semaphores: None when off (0, None, or a Redis
    Cluster)."""
    ttl = config.setting(conf, "semaphore_liveness_ttl", DEFAULT_TTL)
    if not ttl or config.redis_settings(conf).cluster:
        return None
    return float(ttl)


def start(app: Any) -> None:
    """In the worker's main process, before the pool forks: write the family's record and
    keep it refreshed; the pool's children will use it."""
    global _family, _record
    ttl = liveness_ttl(app.conf)
    if ttl is None:
        return
    client = client_for(config.redis_url_for(app.conf), app.conf)
    prefix = config.setting(app.conf, "semaphore_key_prefix", "celery_semaphore")
    _record = liveness.keep(client, prefix, ttl)
    _family = liveness.ident()
    signals.worker_process_init.connect(_in_child, weak=False, dispatch_uid="semaphore-family")


def _in_child(**_: Any) -> None:
    if _family is not None:
        liveness.adopt(_family)
