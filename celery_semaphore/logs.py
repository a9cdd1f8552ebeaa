"""Logging: one logger per concern, and every record names its semaphore and its task.

Every line the package logs goes through :func:`get` and carries two attributes on its
:class:`logging.LogRecord`, ``semaphore`` and ``task_id`` (``None`` when the line concerns no
single semaphore or task, such as a configuration error), so a handler can filter on them or a
format can show them (``%(semaphore)s``).  The same two lead the message text, so the default
Celery log format shows them too::

    [semaphore=payment-gateway task=3f2b...] task proj.charge waits (limit 3, position 7): ...

A line about no semaphore and no task has no such prefix.  The loggers, one per concern
(:data:`LOGGERS` lists them; ``docs/logging.md`` says what each logs, at which level):

    celery_semaphore.acquire    asking for a permit, and getting it (DEBUG)
    celery_semaphore.wait       a task waits, is woken, times out (INFO)
    celery_semaphore.release    permits given back; forced and crash reclaims (WARNING)
    celery_semaphore.heartbeat  lease refreshes; a lease lost (ERROR)
    celery_semaphore.gate       the worker-side gate that holds waiting tasks
    celery_semaphore.config     an invalid configuration stops the worker (CRITICAL)
    celery_semaphore.semaphore  the core primitive (wake-ups, clean-ups)
    celery_semaphore.registry   the worker's record of its semaphores, for the CLI
    celery_semaphore.metrics    the Prometheus exporter
    celery_semaphore.events     in-process event subscribers
    celery_semaphore.cli        operator actions (forced release, reset, runtime limits)

Nothing here imports Celery or Redis: the core uses it too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final

__all__ = ["LOGGERS", "ContextLogger", "context", "get", "prefix"]

#: the concerns, each the last part of a logger name under ``celery_semaphore``
LOGGERS: Final = (
    "acquire",
    "wait",
    "release",
    "heartbeat",
    "restart",
    "gate",
    "config",
    "semaphore",
    "registry",
    "metrics",
    "events",
    "cli",
)

#: the record attributes every line of the package carries
FIELDS: Final = ("semaphore", "task_id")


def prefix(semaphore: str | None, task_id: str | None) -> str:
    """The head of a message: ``[semaphore=NAME task=ID] `` (``-`` for an unknown part), or
    ``""`` when both are unknown."""
    if semaphore is None and task_id is None:
        return ""
    return f"[semaphore={semaphore if semaphore is not None else '-'} task={task_id or '-'}] "


def context(semaphore: str | None, task_id: str | None) -> dict[str, str | None]:
    """The ``extra`` of a record: what filters and formats read."""
    return {"semaphore": semaphore, "task_id": task_id}


class ContextLogger:
    """A logger whose every call names the semaphore and the task (keyword-only and required,
    so a new log line cannot forget them: pass ``None`` when there is none)."""

    __slots__ = ("logger",)

    def __init__(self, name: str) -> None:
        self.logger = logging.getLogger(name)

    @property
    def name(self) -> str:
        return self.logger.name

    def isEnabledFor(self, level: int) -> bool:
        return self.logger.isEnabledFor(level)

    def _emit(
        self,
        level: int,
        msg: str,
        args: tuple[object, ...],
        semaphore: str | None,
        task_id: str | None,
        extra: Mapping[str, object] | None,
        exc_info: bool = False,
    ) -> None:
        if not self.logger.isEnabledFor(level):
            return
        head = prefix(semaphore, task_id)
        if head and args:
            head = head.replace("%", "%%")  # a name with a % must not be read as a format
        fields: dict[str, object] = dict(extra or {})
        fields.update(context(semaphore, task_id))
        # stacklevel 3: the record names the line that called debug()/info()/..., not this one
        self.logger.log(level, head + msg, *args, exc_info=exc_info, extra=fields, stacklevel=3)

    def debug(
        self,
        msg: str,
        *args: object,
        semaphore: str | None,
        task_id: str | None,
        extra: Mapping[str, object] | None = None,
    ) -> None:
        self._emit(logging.DEBUG, msg, args, semaphore, task_id, extra)

    def info(
        self,
        msg: str,
        *args: object,
        semaphore: str | None,
        task_id: str | None,
        extra: Mapping[str, object] | None = None,
    ) -> None:
        self._emit(logging.INFO, msg, args, semaphore, task_id, extra)

    def warning(
        self,
        msg: str,
        *args: object,
        semaphore: str | None,
        task_id: str | None,
        extra: Mapping[str, object] | None = None,
    ) -> None:
        self._emit(logging.WARNING, msg, args, semaphore, task_id, extra)

    def error(
        self,
        msg: str,
        *args: object,
        semaphore: str | None,
        task_id: str | None,
        extra: Mapping[str, object] | None = None,
    ) -> None:
        self._emit(logging.ERROR, msg, args, semaphore, task_id, extra)

    def exception(
        self,
        msg: str,
        *args: object,
        semaphore: str | None,
        task_id: str | None,
        extra: Mapping[str, object] | None = None,
    ) -> None:
        """ERROR, with the traceback of the exception being handled."""
        self._emit(logging.ERROR, msg, args, semaphore, task_id, extra, exc_info=True)

    def critical(
        self,
        msg: str,
        *args: object,
        semaphore: str | None,
        task_id: str | None,
        extra: Mapping[str, object] | None = None,
    ) -> None:
        self._emit(logging.CRITICAL, msg, args, semaphore, task_id, extra)


def get(concern: str) -> ContextLogger:
    """The logger of ``concern`` (one of :data:`LOGGERS`): ``celery_semaphore.<concern>``."""
    if concern not in LOGGERS:
        raise ValueError(f"concern={concern!r} is not accepted: use one of {', '.join(LOGGERS)}")
    return ContextLogger(f"celery_semaphore.{concern}")
