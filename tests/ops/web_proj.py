"""The worker app of tests/ops/test_web.py: tests/integration/proj's app (configured from the
same environment variables) with two more limited tasks.

* ``hold(tag)`` holds semaphore "web" (limit 1) until the test pushes onto
  ``<prefix>:go:<tag>`` (an event, not a sleep; 30 s at most);
* ``script_named()`` is limited by a semaphore whose name is markup, which the page must show
  as text.
"""

from __future__ import annotations

from typing import Any

from celery_semaphore import limited
from tests.integration.proj import LEASE, PREFIX, app, bookkeeping

__all__ = ["SCRIPT_NAME", "app", "go_key", "hold", "impatient", "script_named"]

#: a semaphore name that would run if a page put it into the document as markup
SCRIPT_NAME = '<script>document.title="pwned"</script><img src=x onerror=alert(1)>'


def go_key(tag: str, prefix: str = PREFIX) -> str:
    return f"{prefix}:go:{tag}"


@app.task(bind=True, name="web.hold")
@limited("web", limit=1, lease_ttl=LEASE)
def hold(self: Any, tag: str) -> str:
    # a few short waits: each below the client's socket timeout
    for _ in range(10):
        if bookkeeping().blpop([go_key(tag)], timeout=3):
            break
    return tag


@app.task(name="web.script_named")
@limited(SCRIPT_NAME, limit=1)
def script_named() -> None:
    pass


@app.task(name="web.impatient")
@limited("web", limit=1, lease_ttl=LEASE, max_wait=0.3)
def impatient() -> None:
    """Gives up (SemaphoreTimeout) when "web" stays taken for 0.3 s."""
