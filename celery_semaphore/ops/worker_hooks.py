"""What the ops layer does when a worker starts: a worker-start hook of the Celery layer
(:func:`celery_semaphore.integration.signals.on_worker_start`, installed by :func:`install`).

* Record the worker's limited tasks in the registry (:mod:`celery_semaphore.ops.registry`), so
  ``celery semaphore list`` and the metrics know every semaphore in use.  Best effort: a Redis
  that is down at start is logged, and the worker starts anyway.
* With ``semaphore_metrics_port`` set: count events in this process and its pool children,
  and serve ``/metrics`` from the main process once the worker is ready.  On the prefork pool
  the children's counters reach the exporter through prometheus_client's multiprocess mode;
  when ``PROMETHEUS_MULTIPROC_DIR`` is not set, a fresh directory is made for this worker (and
  removed when it exits).  Unless ``semaphore_metrics_page`` is False, the same port also
  serves the read-only operator page (:mod:`celery_semaphore.ops.web`).
* Answer the remote-control command ``semaphore_held`` (``celery semaphore held``, or
  ``celery inspect semaphore_held``): the requests this worker's gate holds off the pool,
  which ``celery inspect reserved`` does not list (see :func:`held_command`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from typing import Any

from .. import logs
from ..integration import events

__all__ = ["HELD_COMMAND", "held_command", "install", "note_dynamic_name", "on_worker_init"]

log = logs.get("registry")
log_metrics = logs.get("metrics")


def install() -> None:
    """Run :func:`on_worker_init` when a worker starts (idempotent)."""
    from ..integration.signals import on_worker_start

    on_worker_start(on_worker_init)
    _register_held_command()


#: the remote-control (inspect) command that lists a worker's gate-held requests
HELD_COMMAND = "semaphore_held"


def held_command(state: Any = None, **_: Any) -> list[dict[str, Any]]:
    """The requests this worker's gate holds off the pool (not in ``inspect reserved``): task
    id, task name, semaphore, stage, seconds held, place in line."""
    import dataclasses

    from ..integration import wakes

    return [dataclasses.asdict(task) for task in wakes.held()]


def _register_held_command() -> None:
    from celery.worker import control

    if HELD_COMMAND not in control.Panel.data:
        control.inspect_command(name=HELD_COMMAND)(held_command)


def on_worker_init(app: Any, worker: Any = None) -> None:
    """Record the semaphores, and from now on each name made from a task's arguments (the
    ``used`` event); set up metrics; raise ValueError for a configuration that cannot work
    (the metrics extra missing)."""
    port = app.conf.get("semaphore_metrics_port", None)
    if port is not None:
        _prepare_metrics(app, port, str(app.conf.get("semaphore_metrics_address", "0.0.0.0")))
    _record(app, worker)
    global _worker
    _worker = (app, str(getattr(worker, "hostname", "") or ""))
    events.subscribe(_on_event)


#: the app and node name of the worker this process belongs to (the last to start in it)
_worker: tuple[Any, str] | None = None


def _on_event(kind: str, fields: dict[str, Any]) -> None:
    if kind == "used" and _worker is not None:
        app, node = _worker
        name, template, task = fields["name"], fields["template"], fields["task"]
        note_dynamic_name(app, name, template, task, fields["limit"], fields["weight"], node)


def _record(app: Any, worker: Any) -> None:
    from ..core.connection import redis_client
    from ..integration import config
    from . import registry

    try:
        uses = registry.app_uses(app)
        if not uses:
            return
        prefix = app.conf.get("semaphore_key_prefix", "celery_semaphore")
        node = str(getattr(worker, "hostname", "") or "")
        settings = config.redis_settings(app.conf)
        client = redis_client(settings.url, cluster=settings.cluster, options=settings.options)
        try:
            registry.record(client, prefix, uses, settings=registry.app_limits(app), node=node)
        finally:
            client.close()
    except Exception as exc:
        log.warning(
            "celery-semaphore: could not record this worker's semaphores: %s",
            exc,
            semaphore=None,
            task_id=None,
        )


def note_dynamic_name(
    app: Any, name: str, template: str, task: str, limit: int, weight: int, node: str
) -> None:
    """Record a semaphore name made from a task's arguments (``template``) in the registry,
    when this process uses it (at most once per :func:`.registry.refresh_every` seconds per
    name; called by the task's wrapper in a worker), so ``celery semaphore list`` shows it,
    and forget the names unused for ``semaphore_registry_forget_after`` seconds.  Best
    effort: a failure is logged at DEBUG."""
    from ..integration import config
    from ..integration.clients import client_for
    from . import registry

    use = registry.TaskUse(name, task, limit, weight, template=template)
    prefix = app.conf.get("semaphore_key_prefix", "celery_semaphore")
    try:
        client = client_for(config.redis_url_for(app.conf), app.conf)
        registry.note_used(client, prefix, use, node, forget_after=registry.forget_after(app))
    except Exception as exc:  # never fail a task over the registry
        log.debug("could not record a dynamic name: %s", exc, semaphore=name, task_id=None)


def _prepare_metrics(app: Any, port: int, address: str) -> None:
    from ..integration import config

    _ensure_multiprocess_dir()
    try:
        from . import metrics
    except ImportError as exc:
        raise ValueError(
            f"semaphore_metrics_port={port!r} needs prometheus_client, which is not installed: "
            "pip install 'celery-semaphore[prometheus]' (or, from a checkout of the source, "
            "pip install -e '.[prometheus]'; or just pip install prometheus_client)"
        ) from exc
    metrics.enable()
    from celery import signals

    def start(sender: Any = None, **_: Any) -> None:
        signals.worker_ready.disconnect(start)
        try:
            if config.setting(app.conf, "semaphore_metrics_page", True):
                from . import web

                web.start_server(
                    app,
                    port=port,
                    address=address,
                    scan=False,
                    metrics_registry=metrics.exporter_registry(app),
                )
            else:
                metrics.start_exporter(app, port=port, address=address)
        except Exception as exc:  # no metrics is no reason to stop processing tasks
            log_metrics.error(
                "celery-semaphore: cannot serve metrics on %s:%d (semaphore_metrics_port): %s",
                address,
                port,
                exc,
                semaphore=None,
                task_id=None,
            )

    signals.worker_ready.connect(start, weak=False)


def _ensure_multiprocess_dir() -> None:
    """Turn on prometheus_client's multiprocess mode for this worker and its children."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    if "prometheus_client.values" in sys.modules:
        # the value class is chosen when prometheus_client is imported: too late now
        log_metrics.warning(
            "celery-semaphore: prometheus_client was imported before the worker started and "
            "PROMETHEUS_MULTIPROC_DIR is not set: counters of prefork pool processes will not "
            "be exported; set PROMETHEUS_MULTIPROC_DIR to an empty directory",
            semaphore=None,
            task_id=None,
        )
        return
    directory = tempfile.mkdtemp(prefix="celery-semaphore-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    owner = os.getpid()

    def cleanup() -> None:
        if os.getpid() == owner:
            shutil.rmtree(directory, ignore_errors=True)

    atexit.register(cleanup)
