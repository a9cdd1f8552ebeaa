"""The default partition is the queue a task was DELIVERED from, on a real worker consuming two
queues: on the Redis transport (exchange and routing key matched against the worker's queues)
and on RabbitMQ with routing keys unlike the queue names (the AMQP consumer tag tells the
queue), with the worker's gate (held tasks) and without it (the body acquires and parks)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kombu.entity import Exchange as _Exchange
from kombu.entity import Queue as _Queue

from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix

from . import proj
from .conftest import RABBIT_URL, delete_rabbit_queue, require_rabbit
from .helpers import holders, semaphore
from .workers import Env, start_worker, wait_until

Exchange: Any = _Exchange  # kombu is untyped
Queue: Any = _Queue

pytestmark = pytest.mark.timeout(90)

#: 1000: the worker's gate holds waiting tasks; 0: no gate, the body parks them
HOLDS = [pytest.param(1000, id="gate"), pytest.param(0, id="no-gate")]


def _extra(hold: int) -> dict[str, Any]:
    return {"semaphore_worker_hold": hold, "semaphore_slot_wait_timeout": 0.0}


def _check_partitions(env: Env, send: Any, queues: list[str], worker_queues: list[str]) -> None:
    """Hold the only unit, send one task per queue, and read the partition of each waiter."""
    worker = start_worker(env, pool="threads", concurrency=4, queues=worker_queues)
    try:
        sem = semaphore(env)
        held = sem.acquire(blocking=False)
        assert held is not None
        try:
            results = [send(queue, f"t-{i}") for i, queue in enumerate(queues)]
            wait_until(lambda: len(sem.waiters()) == len(queues), 30, what="all wait")
            by_task = {w.owner.get("task_id"): w.partition for w in sem.waiters()}
            assert by_task == {r.id: q for r, q in zip(results, queues, strict=True)}
            parts = {p.name: p.waiters for p in sem.inspect().partitions if p.waiters}
            assert parts == dict.fromkeys(queues, 1)
        finally:
            held.release()
        done = sorted(r.get(timeout=30) for r in results)
        assert done == [f"t-{i}" for i in range(len(queues))]
    finally:
        worker.stop()
    wait_until(lambda: not holders(env) and not sem.waiters(), 10, what="nothing left")


@pytest.fixture
def redis_env(redis_server: RedisServer) -> Iterator[Env]:
    e = Env(redis_url=redis_server.url(0), broker_url=redis_server.url(0), limit=1)
    yield e
    client = redis_server.client(0)
    delete_prefix(client, e.prefix)
    client.close()


@pytest.mark.parametrize("hold", HOLDS)
def test_partition_is_the_delivery_queue_on_redis(redis_env: Env, hold: int) -> None:
    env = redis_env
    env.extra = _extra(hold)
    qa, qb = f"{env.prefix}-a", f"{env.prefix}-b"
    app = env.client_app()

    def send(queue: str, tag: str) -> Any:
        return app.send_task(proj.work.name, (tag, 0.05), queue=queue)

    try:
        _check_partitions(env, send, [qa, qb], [qa, qb])
    finally:
        app.close()


@pytest.mark.parametrize("hold", HOLDS)
def test_partition_is_the_queue_not_the_routing_key_on_rabbitmq(
    redis_server: RedisServer, hold: int
) -> None:
    require_rabbit()
    env = Env(redis_url=redis_server.url(0), broker_url=RABBIT_URL, limit=1, extra=_extra(hold))
    qa, qb = f"{env.prefix}-a", f"{env.prefix}-b"
    exchange = Exchange(f"{env.prefix}-x", type="direct", auto_delete=True)
    # bound with routing keys unlike their names; the worker only knows the names (-Q)
    bindings = {qa: "rk-bulk", qb: "rk-interactive"}
    app = env.client_app()
    with app.connection_for_write() as conn:
        for queue, key in bindings.items():
            Queue(queue, exchange, routing_key=key)(conn.default_channel).declare()

    def send(queue: str, tag: str) -> Any:
        return app.send_task(
            proj.work.name, (tag, 0.05), exchange=exchange, routing_key=bindings[queue]
        )

    try:
        _check_partitions(env, send, [qa, qb], [qa, qb])
    finally:
        app.close()
        delete_rabbit_queue(env, qa, qb)
        client = redis_server.client(0)
        delete_prefix(client, env.prefix)
        client.close()
