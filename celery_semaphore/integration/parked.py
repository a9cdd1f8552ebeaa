"""A parked task is logged as parked, not as Celery's "Task ... ignored".

A task that parks (re-published with a countdown to wait in the broker) ends its present run
with ``Ignore``, which Celery logs as ``Task proj.charge[<id>] ignored``: that reads like a
dropped task.  :func:`note` remembers the ids this process parks; a filter on Celery's trace
logger rewrites that line for them.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping

__all__ = ["PARKED_LINE", "install", "note"]

#: what Celery's "ignored" line says instead, for a task that parked
PARKED_LINE = "Task %(name)s[%(id)s] parked: it waits in the broker for its permit"
#: ids remembered (the oldest forgotten first)
REMEMBERED = 1000

_parked: OrderedDict[str, None] = OrderedDict()


def note(task_id: str | None) -> None:
    """The task ``task_id`` parks now: its "ignored" line is rewritten."""
    if not task_id:
        return
    _parked[task_id] = None
    while len(_parked) > REMEMBERED:
        _parked.popitem(last=False)


class _ParkedLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, Mapping) and args.get("description") == "ignored":
            task_id = args.get("id")
            if isinstance(task_id, str) and task_id in _parked:
                del _parked[task_id]
                record.msg = PARKED_LINE
        return True


_filter = _ParkedLine()


def install() -> None:
    """Put the filter on Celery's trace logger (once per process)."""
    logger = logging.getLogger("celery.app.trace")
    if _filter not in logger.filters:
        logger.addFilter(_filter)
