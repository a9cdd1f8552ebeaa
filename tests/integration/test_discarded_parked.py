"""A parked task that Celery discards (revoked, or past its ``expires``) gives its place up at
once: the tasks behind it run as soon as the holders end, not a lease later.

Before, Celery's consumer dropped the revoked or expired copy before our code saw it, its
place survived (kept for ``countdown + lease``), the next release reserved the units for it,
and the tasks behind it finished about 60 s (the lease) after the holders ended.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from . import proj
from .helpers import holders, ran, semaphore
from .workers import Env, start_worker, wait_until

pytestmark = pytest.mark.timeout(120)

#: far below the lease (60 s) the bug waited for, far above a handoff
PROMPTLY = 15.0


def _tickets(env: Env) -> list[str]:
    return [w.ticket for w in semaphore(env).waiters()]


@pytest.mark.parametrize("how", ["revoke", "expires"])
def test_a_discarded_parked_task_does_not_block_its_line(env: Env, how: str) -> None:
    env.extra.update(semaphore_worker_hold=0)  # waits park (re-published with a countdown)
    worker = start_worker(env, pool="prefork", concurrency=4)
    app = env.client_app()
    try:
        # the holders run 5 s: the victim and the task behind it park well before they end,
        # on a slow host too, and the victim (expires 3 s after it is sent, up to 2 s after
        # the holders began) is past its expiry before the release that would wake it
        busy = [app.send_task(proj.work.name, (f"h{i}", 5.0)) for i in range(env.limit)]
        wait_until(lambda: len(holders(env)) == env.limit, 20, what="the holders run")
        options: dict[str, Any] = {"expires": 3.0} if how == "expires" else {}
        victim = app.send_task(proj.parks_long.name, ("victim",), **options)
        wait_until(lambda: f"{victim.id}:0" in _tickets(env), 10, what="the victim parked")
        behind = app.send_task(proj.parks_long.name, ("behind",))
        wait_until(lambda: len(_tickets(env)) == 2, 10, what="the second parked behind it")
        if how == "revoke":
            app.control.revoke(victim.id)
        for r in busy:
            r.get(timeout=30)
        ended = time.monotonic()
        assert behind.get(timeout=PROMPTLY * 2) == "behind"
        assert time.monotonic() - ended < PROMPTLY, "the line waited for the victim's place"
        victim.get(timeout=10, propagate=False)
        assert victim.state == "REVOKED"
        assert "victim" not in ran(env)
        assert holders(env) == []
        assert semaphore(env).waiters() == []
    finally:
        worker.stop()
