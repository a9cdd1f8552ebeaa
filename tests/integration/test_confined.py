"""Confined failures: whatever a message or the user's per-call code raises while the worker
decides about a limited task fails that one task, visibly (FAILURE with a
SemaphoreRequestError naming the task, the callable or header and the value), its message is
acknowledged (never redelivered in a loop), and the worker goes on with the next tasks.

Before, a ``limit=`` callable that raised KeyError in the worker's consumer killed the worker
(``Unrecoverable error``), and each restarted worker died on the same unacknowledged message;
a ``semaphore_wait`` header carrying ``Infinity`` did the same.
"""

from __future__ import annotations

from typing import Any

import pytest

from . import proj
from .helpers import holders, ran, semaphore
from .workers import Env, start_worker, wait_ready

pytestmark = pytest.mark.timeout(120)

ROUTES = [
    pytest.param({}, id="gate"),
    pytest.param({"semaphore_worker_hold": 0}, id="in-slot"),
]


def _finish(results: list[Any]) -> list[str]:
    return [r.get(timeout=60) for r in results]


def _assert_failed(result: Any, *words: str) -> None:
    result.get(timeout=60, propagate=False)
    assert result.state == "FAILURE"
    assert type(result.result).__name__ == "SemaphoreRequestError", repr(result.result)
    for word in words:
        assert word in str(result.result), (word, str(result.result))


def _assert_clean(env: Env, name: str, worker: Any, poison: str) -> None:
    assert holders(env, name) == []
    assert semaphore(env, name).waiters() == []
    wait_ready(env, worker, 10)  # still running, and answering
    # nothing left to deliver again: the poison message was acknowledged
    assert env.redis().llen(env.queue) == 0
    assert not any(poison.encode() in raw for raw in env.redis().hvals("unacked"))


@pytest.mark.parametrize("extra", ROUTES)
def test_a_per_key_callable_that_raises_fails_only_its_task(
    env: Env, extra: dict[str, Any]
) -> None:
    env.extra.update(extra)
    worker = start_worker(env, pool="prefork", concurrency=2)
    app = env.client_app()
    try:
        poison = app.send_task(proj.by_tier.name, ("acme", "platinum", "poison"))
        good = [app.send_task(proj.by_tier.name, ("acme", "pro", f"t{i}")) for i in range(4)]
        assert sorted(_finish(good)) == ["t0", "t1", "t2", "t3"]
        _assert_failed(poison, proj.by_tier.name, "KeyError", "platinum", "limit")
        _assert_clean(env, "tier:acme", worker, poison.id)
        assert "poison" not in ran(env)
    finally:
        worker.stop()
    assert "Unrecoverable error" not in worker.output() + worker.log()


@pytest.mark.parametrize("extra", ROUTES)
def test_a_malformed_wait_header_fails_only_its_task(env: Env, extra: dict[str, Any]) -> None:
    env.extra.update(extra)
    worker = start_worker(env, pool="prefork", concurrency=2)
    app = env.client_app()
    try:
        bad = app.send_task(
            proj.work.name, ("bad",), headers={"semaphore_wait": {"r": 0, "e": float("inf")}}
        )
        good = [app.send_task(proj.work.name, (f"t{i}",)) for i in range(4)]
        assert sorted(_finish(good)) == ["t0", "t1", "t2", "t3"]
        _assert_failed(bad, "semaphore_wait", "'e'", "inf")
        _assert_clean(env, "main", worker, bad.id)
        assert "bad" not in ran(env)
    finally:
        worker.stop()
    assert "Unrecoverable error" not in worker.output() + worker.log()
