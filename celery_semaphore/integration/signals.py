"""Worker wiring: validate settings at start, and release in the parent what a dead child held.

* ``worker_init`` (main process, every pool): validate every ``semaphore_*`` setting; an invalid
  one stops the worker with a message naming the setting.  Then install the gate
  (:mod:`celery_semaphore.integration.gate`) when the app has limited tasks.
* ``celeryd_after_setup`` (once the worker's logging is set up, where Celery warns of its own
  renamed settings): warn of each renamed setting or task option still given under its old
  name (:mod:`celery_semaphore.integration.renames`).
* ``task_failure`` and ``task_revoked`` in the process that did *not* run the body (the prefork
  parent, after a hard time limit, a SIGKILL or OOM of the child, or a terminate): release the
  dead execution's permit at once, found by its token (``<task id>:<retries>``) and the claim
  of the delivery that failed (stamped by the consumer), instead of waiting for the lease to
  expire.  Under that claim only: a delivery that failed without holding (a copy that timed
  out waiting while another copy of the same task id runs) releases nothing.  (With
  ``reject_on_worker_lost`` Celery sends no ``task_failure``: the redelivered copy waits for the
  dead child's lease instead.)
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from typing import Any

from celery import signals
from celery.exceptions import TimeLimitExceeded

from .. import logs
from ..core import connection
from ..core.exceptions import SemaphoreError
from . import children, config, discarded, events, family, patterns, renames, started
from .decorators import spec_of
from .delivery import handled_here, stamped_claim, ticket_of
from .locks import lock_names, lock_of_request
from .spec import LimitSpec, Member, check_cap, check_group_rates, check_rate_weight, check_weight

__all__ = [
    "WorkerStartHook",
    "check_app",
    "connect",
    "on_worker_start",
    "unmatched_keys",
    "warn_unmatched_keys",
]

#: ``hook(app, worker)``, run in the worker's main process at ``worker_init``, after the
#: settings were checked; a TypeError or ValueError it raises stops the worker like an invalid
#: setting (the ops layer records the semaphores and starts the metrics this way)
WorkerStartHook = Callable[[Any, Any], None]
_start_hooks: list[WorkerStartHook] = []


def on_worker_start(hook: WorkerStartHook) -> None:
    """Run ``hook(app, worker)`` when a worker with limited tasks starts (idempotent)."""
    if hook not in _start_hooks:
        _start_hooks.append(hook)


log = logs.get("release")
log_config = logs.get("config")


def check_app(app: Any) -> list[tuple[str, LimitSpec]]:
    """Check what a worker checks before it touches Redis: every ``semaphore_*`` setting (an
    unknown one too), the Redis settings when the app has limited tasks, and each limited
    task's options, weights and caps against the settings.  Raises TypeError or ValueError
    naming the setting; returns the limited tasks as ``(task name, spec)``.  The CLI calls it
    too, so that it refuses what a worker refuses."""
    config.validate_app_settings(app.conf, getattr(app, "namespace", None))
    specs = [(t.name, spec_of(t)) for t in list(app.tasks.values())]
    limited = [(name, spec) for name, spec in specs if spec is not None]
    if limited:
        redis = config.redis_settings(app.conf)  # URL, cluster flag and options together
        if redis.cluster and not app.conf.get("semaphore_hash_tag", None):
            _check_one_slot(limited)
    for task_name, spec in limited:
        config.resolve(app.conf, spec.options)  # task options with app settings
        for member in spec.members:
            _check_member(app.conf, task_name, member)
        if len(spec.members) > 1:
            for member in spec.members:
                template = member.name if member.dynamic_name else None
                rates = config.semaphore_rates(app.conf, member.name, (), template)
                check_group_rates(f"task {task_name}", member.name, rates)
    return limited


#: the settings keyed by semaphore name (exact, template or pattern)
PER_SEMAPHORE_SETTINGS = (
    "semaphore_limits",
    "semaphore_rates",
    "semaphore_queue_limits",
    "semaphore_queue_weights",
)


def unmatched_keys(app: Any, limited: list[tuple[str, LimitSpec]]) -> list[str]:
    """The keys of the per-semaphore settings that surely name no semaphore of ``limited``
    (the app's limited tasks, from :func:`check_app`), each as ``"<setting> key <key>"`` with a
    did-you-mean guess.  A key counts as used when it is a static name or name template of a
    task, or could name something a template produces (``"llm:*"`` and ``"llm:acme"`` both
    fit ``"llm:{customer_id}"``); while a task takes a semaphore named by a callable, which can
    give any name, nothing is reported."""
    members = [m for _, spec in limited for m in spec.members]
    if any(m.name_fn is not None for m in members):
        return []
    static = sorted({m.name for m in members if not m.dynamic_name})
    templates = sorted({m.name for m in members if m.dynamic_name})
    out = []
    for setting in PER_SEMAPHORE_SETTINGS:
        table = app.conf.get(setting, None) or {}
        for key in table:
            if patterns.could_match(key, static, templates):
                continue
            guess = _guess(key, [*static, *templates])
            hint = f" (did you mean {guess!r}?)" if guess else ""
            out.append(f"{setting} key {key!r}{hint}")
    return out


def _bare(text: str) -> str:
    """``text`` without wildcards, character sets and placeholders: what a guess compares."""
    return re.sub(r"\{[^{}]*\}|\[[^\]]*\]|[*?]", "", text)


def _guess(key: str, names: list[str]) -> str | None:
    """The static name or template ``key`` was probably meant to be (a typo), or None."""
    bare = {_bare(n): n for n in reversed(names)}  # the first of equal texts wins
    guess = config.did_you_mean(_bare(key), bare, cutoff=0.6)
    return bare[guess] if guess is not None else None


def warn_unmatched_keys(app: Any, limited: list[tuple[str, LimitSpec]]) -> list[str]:
    """Log one warning listing :func:`unmatched_keys` (a worker does at start); return them."""
    keys = unmatched_keys(app, limited)
    if keys:
        log_config.warning(
            "celery-semaphore: %s: no limited task of this worker uses such a semaphore name, "
            "so these settings apply to nothing here (a misspelt name? a task this worker "
            "does not import is fine)",
            "; ".join(keys),
            semaphore=None,
            task_id=None,
        )
    return keys


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is None:
        return
    try:
        limited = check_app(app)
        if limited:
            redis = config.redis_settings(app.conf)
            connection.check(redis.url, cluster=redis.cluster, options=redis.options)
        for hook in list(_start_hooks):  # ops: registry and metrics
            hook(app, sender)
    except (TypeError, ValueError) as exc:
        # Shown once: logged, and the worker stops with status 1 without Python printing
        # the SystemExit again; unless no handler would show the record (Celery has not set
        # up logging yet: it reaches stderr through Python's last-resort handler, or the
        # handlers the program configured, which may have disabled this logger).
        log_config.critical(
            "celery-semaphore: invalid configuration: %s", exc, semaphore=None, task_id=None
        )
        stop = SystemExit(f"celery-semaphore: invalid configuration: {exc}")
        if _shown(log_config.logger, logging.CRITICAL):
            stop.code = 1
        raise stop from exc
    if limited:
        warn_unmatched_keys(app, limited)
    if limited and app.conf.get("semaphore_enabled", True):
        from .consumer import install

        # before the pool's children fork: the bodies say when they start, and the family's
        # liveness record is written (the children use it)
        started.take_over(app, [name for name, _ in limited])
        family.start(app)
        install(app)


def _on_after_setup(sender: Any = None, instance: Any = None, **_: Any) -> None:
    app = getattr(instance, "app", None)
    if app is not None:
        renames.warn_renamed(app.conf)


def _shown(logger: logging.Logger, level: int) -> bool:
    """Whether a record of ``level`` logged on ``logger`` reaches some handler."""
    if logger.disabled or not logger.isEnabledFor(level):
        return False
    return logger.hasHandlers() or logging.lastResort is not None


def _check_one_slot(limited: list[tuple[str, Any]]) -> None:
    """On Redis Cluster, the semaphores a task takes at once go through one script, so they
    must live in one slot: that needs semaphore_hash_tag."""
    for task_name, spec in limited:
        if len(spec.members) > 1:
            names = ", ".join(repr(m.name) for m in spec.members)
            raise ValueError(
                f"task {task_name} takes several semaphores at once ({names}); on Redis "
                "Cluster they must share one slot: set semaphore_hash_tag (e.g. "
                "semaphore_hash_tag='proj')"
            )


def _check_member(conf: Any, task_name: str, member: Member) -> None:
    """A static weight must fit the limit and every cap the settings give it."""
    if not member.static_weight or member.limit_by is not None:
        return  # checked per call
    limit = config.semaphore_limit(conf, member.name, member.limit)
    check_weight(f"task {task_name}", member.name, member.weight, limit, "semaphore_limits")
    if member.rate_by is None:
        rates = config.semaphore_rates(conf, member.name, member.rates)
        check_rate_weight(f"task {task_name}", member.name, member.weight, rates)
    caps = config.partition_caps(conf, (member.name,), member.queue_limits)
    for partition, cap in caps.items():
        check_cap(
            f"task {task_name}",
            member.name,
            member.weight,
            partition,
            cap,
            "semaphore_queue_limits",
        )


def _release_dead(task: Any, task_id: str | None, request: Any, why: str) -> None:
    spec = spec_of(task)
    if spec is None or not task_id or request is None or getattr(request, "id", None) != task_id:
        return
    token = ticket_of(task_id, getattr(request, "retries", 0))
    if handled_here(token):
        return
    claim = stamped_claim(request)
    if claim is None:
        # not a delivery this worker's consumer saw: nothing to release under (its lease
        # brings back whatever it held)
        return
    app = task.app
    if not app.conf.get("semaphore_enabled", True):
        return
    try:
        # the semaphores this execution took: its names may come from its arguments (the
        # partition does not matter for a release)
        lock = lock_of_request(task, spec, request)
        released = lock.release_token(token, claim=claim, only_now=True)
    except (SemaphoreError, TypeError, ValueError) as exc:
        log.error(
            "could not release the permit of task %s after %s: %s; it comes back when its "
            "lease expires",
            task.name,
            why,
            exc,
            semaphore=spec.name,
            task_id=task_id,
        )
        return
    if released:
        for name in lock_names(lock):  # ops: events
            events.emit("reclaimed", name=name, count=1, reason="crashed", task_id=task_id)
        log.warning(
            "released the permit of task %s after %s",
            task.name,
            why,
            semaphore=lock.name,
            task_id=task_id,
        )


def _release_after_exit(
    pids: set[int], task: Any, task_id: str | None, request: Any, why: str
) -> None:
    """Release once the process that ran the body is gone (see :mod:`.children`)."""

    def still_running() -> None:
        log.warning(
            "the process that ran task %s is still alive %.0fs after %s; its permit comes back "
            "when its lease expires",
            task.name,
            children.EXIT_WAIT,
            why,
            semaphore=getattr(spec_of(task), "name", None),
            task_id=task_id,
        )

    children.after_exit(pids, lambda: _release_dead(task, task_id, request, why), still_running)


def _on_task_failure(
    sender: Any = None, task_id: str | None = None, exception: BaseException | None = None, **_: Any
) -> None:
    if sender is None:
        return
    request = getattr(sender, "request", None)  # a thread-local: read it now
    why = f"{type(exception).__name__} in the worker"
    if isinstance(exception, TimeLimitExceeded) and spec_of(sender) is not None:
        # billiard runs this before it kills the child: wait until one of the pool's children
        # (the one running the body) is gone
        _release_after_exit(children.pool_children(), sender, task_id, request, why)
        return
    _release_dead(sender, task_id, request, why)


def _on_task_revoked(
    sender: Any = None,
    request: Any = None,
    terminated: bool = False,
    expired: bool = False,
    **_: Any,
) -> None:
    if sender is None or request is None:
        return
    if not terminated:  # dropped before it ran: a parked copy gives up its place
        discarded.leave_line(sender, request, expired)
        return
    pid = getattr(request, "worker_pid", None)  # announced as the signal is sent
    pids = {pid} if isinstance(pid, int) and pid != os.getpid() else set()
    _release_after_exit(
        pids, sender, getattr(request, "id", None), request, "revoke(terminate=True)"
    )


_connected = False


def connect() -> None:
    """Connect the handlers (idempotent; done on import of the package)."""
    global _connected
    if _connected:
        return
    signals.worker_init.connect(_on_worker_init, weak=False)
    signals.celeryd_after_setup.connect(_on_after_setup, weak=False)
    signals.task_failure.connect(_on_task_failure, weak=False)
    signals.task_revoked.connect(_on_task_revoked, weak=False)
    signals.task_received.connect(started.on_received, weak=False)
    _connected = True
