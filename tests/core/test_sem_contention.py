"""Many processes contending for one semaphore never hold more than its limit at once."""

from __future__ import annotations

import multiprocessing
import random
import time
from collections.abc import Callable
from multiprocessing.sharedctypes import Synchronized
from typing import Any

import pytest

from celery_semaphore import Semaphore

PROCESSES = 12
LIMIT = 4
CYCLES = 30
WORKER_DEADLINE = 10.0  # seconds a worker may spend before it gives up


def _worker(
    url: str,
    prefix: str,
    name: str,
    seed: int,
    lock: Any,
    current: Synchronized[int],
    peak: Synchronized[int],
    done: Synchronized[int],
    errors: Synchronized[int],
    ready: Any,
) -> None:
    rng = random.Random(seed)
    sem = Semaphore(name, LIMIT, redis=url, key_prefix=prefix, lease_ttl=30.0)
    # spawned processes start seconds apart on a loaded machine: they contend only once all
    # are up (else the first may be done before the last starts, and the limit never binds)
    ready.wait(timeout=30)
    deadline = time.monotonic() + WORKER_DEADLINE
    try:
        for _ in range(CYCLES):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            permit = sem.acquire(timeout=remaining)
            if permit is None:
                break
            with lock:
                current.value += 1
                peak.value = max(peak.value, current.value)
            time.sleep(rng.uniform(0.005, 0.015))
            with lock:
                current.value -= 1
            if not permit.release():
                with lock:
                    errors.value += 1
            with lock:
                done.value += 1
    except Exception:
        with lock:
            errors.value += 1
        raise


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_processes_never_exceed_limit(
    redis_url: str, key_prefix: str, make_semaphore: Callable[..., Semaphore]
) -> None:
    ctx = multiprocessing.get_context("spawn")
    lock = ctx.Lock()
    current: Synchronized[int] = ctx.Value("i", 0, lock=False)  # guarded by `lock`
    peak: Synchronized[int] = ctx.Value("i", 0, lock=False)
    done: Synchronized[int] = ctx.Value("i", 0, lock=False)
    errors: Synchronized[int] = ctx.Value("i", 0, lock=False)
    ready = ctx.Barrier(PROCESSES)
    procs = [
        ctx.Process(
            target=_worker,
            args=(
                redis_url,
                key_prefix,
                "contended",
                seed,
                lock,
                current,
                peak,
                done,
                errors,
                ready,
            ),
            daemon=True,
        )
        for seed in range(PROCESSES)
    ]
    started = time.monotonic()
    for proc in procs:
        proc.start()
    try:
        for proc in procs:
            proc.join(timeout=max(0.1, started + WORKER_DEADLINE + 25 - time.monotonic()))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(5)

    assert [proc.exitcode for proc in procs] == [0] * PROCESSES
    assert errors.value == 0
    assert done.value == PROCESSES * CYCLES, "some workers gave up before their deadline"
    assert 1 <= peak.value <= LIMIT
    # with 12 processes contending, the limit is actually reached (else the test proves little)
    assert peak.value == LIMIT

    sem = make_semaphore("contended", LIMIT)
    assert sem.holders() == []
    assert sem.waiters() == []
    assert sem.available() == LIMIT
