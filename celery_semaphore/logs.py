"""Logging: one logger per concern, and every record names its semaphore and its task.

Every line the package logs goes through :func:`get` and carries two attributes on its
:class:`logging.LogRecord`, ``semaphore`` and ``task_id`` (``None`` when the line concerns no
single semaphore or task, such as a configuration error), so a handler can filter on them or a
format can show them (``%(semaphore)s``).  The same two lead the message text, so the default
Celery log format shows them too::

    [semaphore=payment-gateway task=3f2b...] task proj.charge waits (limit 3, position 7): ...

A line about no semaphore and no task has no such prefix.

Names, task ids and owners come from task arguments and from any producer, so nothing of theirs
reaches a terminal raw: the prefix, the ``semaphore`` and ``task_id`` attributes, every string
field of ``extra`` and every argument of the message that is not a number are shown through
:func:`printable` (``\\x1b``, ``\\r``, ``\\n``, ``\\u202e`` instead of the character, a
backslash doubled), and a traceback keeps its line breaks but has its other control characters
escaped.  The command line (``celery semaphore``) shows names and ids through the same function.

The loggers, one per concern (:data:`LOGGERS` lists them; ``docs/logging.md`` says what each
logs, at which level):

    celery_semaphore.acquire    asking for a permit, and getting it (DEBUG)
    celery_semaphore.wait       a task waits, is woken, times out (INFO)
    celery_semaphore.release    permits given back; forced and crash reclaims (WARNING)
    celery_semaphore.heartbeat  lease refreshes; a lease lost (ERROR)
    celery_semaphore.gate       the worker-side gate that holds waiting tasks
    celery_semaphore.config     an invalid configuration stops the worker (CRITICAL); Redis
                                unreachable when the worker starts (WARNING)
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

__all__ = ["LOGGERS", "ContextLogger", "context", "get", "prefix", "printable"]

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


#: the characters written by name rather than by code
_NAMED: Final = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(char: str) -> str:
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(value: object, keep: str = "") -> str:
    """``value`` as text that a terminal or a log shows and never interprets.

    A character that is not printable (``str.isprintable``: the C0 and C1 controls, DEL, the
    format characters such as the bidi override U+202E, line and paragraph separators, spaces
    other than U+0020) is written as its Python escape (``\\x1b``, ``\\r``, ``\\n``,
    ``\\u202e``, as ``repr`` writes them), and a backslash as two, so the text reads back
    unambiguously: ``a\\x1b`` is the escape, ``a\\\\x1b`` the four characters.  Printable
    text is returned as it is::

        >>> print(printable("llm:\\x1b[2J\\r\\n\\u202e"), printable("a\\\\b"), printable("café"))
        llm:\\x1b[2J\\r\\n\\u202e a\\\\b café

    The characters of ``keep`` are left as they are: a traceback keeps its line breaks and its
    backslashes (``keep="\\n\\\\"``), a message whose names were quoted with ``repr`` its
    backslashes (``keep="\\\\"``).
    """
    text = value if isinstance(value, str) else str(value)
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(c if c in keep or (c.isprintable() and c != "\\") else _escaped(c) for c in text)


class _Shown:
    """A message argument that formats as :func:`printable` text (``%s``), or as its repr with
    the controls left in it escaped (``%r``)."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __str__(self) -> str:
        return printable(self.value)

    def __repr__(self) -> str:
        return printable(repr(self.value), keep="\\")


def _shown(arg: object) -> object:
    # numbers stay themselves, for %d and %.1f (a bool is an int)
    return arg if isinstance(arg, (int, float)) else _Shown(arg)


def _shown_args(args: tuple[object, ...]) -> tuple[object, ...]:
    if len(args) == 1 and isinstance(args[0], Mapping) and args[0]:
        # logging formats a single mapping as %(key)s
        return ({key: _shown(value) for key, value in args[0].items()},)
    return tuple(_shown(arg) for arg in args)


class _Tracebacks(logging.Filter):
    """Formats a record's traceback now, with its controls escaped (a handler's formatter uses
    the text it finds in ``exc_text``): an exception's message may carry a name."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and not record.exc_text:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_text = printable(text, keep="\n\\")
        return True


_TRACEBACKS: Final = _Tracebacks()


def prefix(semaphore: str | None, task_id: str | None) -> str:
    """The head of a message: ``[semaphore=NAME task=ID] `` (``-`` for an unknown part), or
    ``""`` when both are unknown; both shown :func:`printable`."""
    if semaphore is None and task_id is None:
        return ""
    name = printable(semaphore) if semaphore is not None else "-"
    return f"[semaphore={name} task={printable(task_id) if task_id else '-'}] "


def context(semaphore: str | None, task_id: str | None) -> dict[str, str | None]:
    """The ``extra`` of a record: what filters and formats read (shown :func:`printable`)."""
    return {
        "semaphore": None if semaphore is None else printable(semaphore),
        "task_id": None if task_id is None else printable(task_id),
    }


class ContextLogger:
    """A logger whose every call names the semaphore and the task (keyword-only and required,
    so a new log line cannot forget them: pass ``None`` when there is none)."""

    __slots__ = ("logger",)

    def __init__(self, name: str) -> None:
        self.logger = logging.getLogger(name)
        if _TRACEBACKS not in self.logger.filters:
            self.logger.addFilter(_TRACEBACKS)

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
        fields: dict[str, object] = {
            key: printable(value) if isinstance(value, str) else value
            for key, value in (extra or {}).items()
        }
        fields.update(context(semaphore, task_id))
        # stacklevel 3: the record names the line that called debug()/info()/..., not this one
        self.logger.log(
            level, head + msg, *_shown_args(args), exc_info=exc_info, extra=fields, stacklevel=3
        )

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
