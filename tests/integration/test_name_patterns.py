"""``semaphore_limits`` keyed by glob patterns, in a real prefork worker: a pattern limits the
semaphores of a dynamic name (counted per customer by an independent counter), the most
specific key wins, and the worker warns once at start about the keys that match no semaphore
of its tasks, with a guess, but not about the patterns that fit a template."""

from __future__ import annotations

import pytest

from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix

from . import proj
from .helpers import holders, max_inside
from .workers import Env, start_worker

pytestmark = pytest.mark.timeout(120)


def test_pattern_limits_a_dynamic_name_and_misspelt_keys_are_warned_about(
    redis_server: RedisServer,
) -> None:
    url = redis_server.url(0)
    env = Env(
        redis_url=url,
        broker_url=url,
        limit=3,  # the code's limit of cust:{customer}
        extra={
            "semaphore_limits": {
                "cust:*": 2,  # every customer but ...
                "cust:a*": 1,  # ... the more specific pattern's
                "cust:ajax": 3,  # ... and the exact name's
                "mian": 5,  # a typo of "main"
            },
            "semaphore_queue_limits": {"unitz": {"bulk": 1}},  # a typo of "units"
        },
    )
    node = start_worker(env, pool="prefork", concurrency=8)
    try:
        app = env.client_app()
        customers = {"acme": 1, "globex": 2, "ajax": 3}
        results = [
            app.send_task(proj.per_customer.name, (c, f"{c}-{i}", 0.3))
            for i in range(6)
            for c in customers
        ]
        assert sorted(r.get(timeout=90) for r in results) == sorted(
            f"{c}-{i}" for i in range(6) for c in customers
        )
        app.close()
    finally:
        node.stop()
    try:
        # each customer's limit held, and each was reached: the key that applied was the one
        # expected (a pattern that did not apply would let acme or globex reach 3)
        for customer, limit in customers.items():
            assert max_inside(env, f"cust-{customer}") == limit, customer
            assert holders(env, f"cust:{customer}") == []
        text = node.log() + node.output()
        warnings = [line for line in text.splitlines() if "no limited task of this worker" in line]
        assert len(warnings) == 1, text[-4000:]
        assert "semaphore_limits key 'mian' (did you mean 'main'?)" in warnings[0]
        assert "semaphore_queue_limits key 'unitz' (did you mean 'units'?)" in warnings[0]
        assert "cust:" not in warnings[0]  # the patterns fit the template cust:{customer}
    finally:
        client = redis_server.client(0)
        delete_prefix(client, env.prefix)
        client.delete(env.queue)
        client.close()
