"""``celery -A proj semaphore ...``: see and operate the semaphores from the terminal.

Registered as a Celery sub-command through the ``celery.commands`` entry point.  Every
``celery`` invocation (workers included) imports this module, so it imports nothing beyond
what ``celery`` itself already has loaded (click and ``celery.bin.base``); Redis, the core
and the rendering are imported inside the commands.

The commands live by concern: :mod:`.cli_read` (``list``, ``show``, ``explain``, ``top``,
``audit``, ``held``), :mod:`.cli_actions` (``set-limit``, ``release``, ``reset``) and
:mod:`.cli_serve` (``serve``, ``metrics``); :mod:`.cli_common` holds what they share.

Exit codes (also in docs/cli.md):

==  ==================================================================================
0   done
1   not found: unknown semaphore, task not holding or waiting, token not held
2   usage error (bad option or argument, invalid settings, metrics extra or port)
3   Redis not configured, unreachable or failing (or holding data it should not)
4   cancelled at the confirmation prompt
==  ==================================================================================

Errors are one line on stderr, starting with ``celery semaphore: error:``.  Names, task ids
and tokens are shown escaped (:func:`celery_semaphore.logs.printable`), never raw.
"""

from __future__ import annotations

from typing import Any

import click

from . import cli_actions, cli_read, cli_serve
from .cli_common import EXIT_CANCELLED, EXIT_NOT_FOUND, EXIT_REDIS, EXIT_USAGE

__all__ = ["EXIT_CANCELLED", "EXIT_NOT_FOUND", "EXIT_REDIS", "EXIT_USAGE", "semaphore"]


@click.group(name="semaphore")
def semaphore(**_: Any) -> None:
    """See and operate celery-semaphore semaphores (limits, holders, waiters)."""


for _command in (
    cli_read.list_,
    cli_read.show,
    cli_read.explain,
    cli_read.top,
    cli_read.audit_,
    cli_read.held,
    cli_actions.set_limit,
    cli_actions.release,
    cli_actions.reset,
    cli_serve.serve,
    cli_serve.metrics,
):
    semaphore.add_command(_command)
