"""Redis restarts mid-run and forgets every holder (no persistence), while two long bodies
still run.  The workers must not crash-loop, must recover by themselves, and (with the default
``semaphore_restart_policy = "fail_closed"``) never let more than ``limit`` bodies run: for one
lease after they notice the loss they grant nothing new, while the running bodies re-assert
their permits.  (See celery_semaphore.integration.restart.)
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest

from celery_semaphore.ops.testing import (
    RedisServer,
    find_redis_server_binary,
    start_redis_server,
)
from tests.conftest import delete_prefix
from tests.integration.workers import start_worker, wait_until

from .harness import Chaos, measure

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(150)]

LEASE = 4.0


def _restart(server: RedisServer) -> None:
    """Stop the server and start a fresh one, empty, on the same port."""
    assert server.process is not None
    server.process.terminate()
    server.process.wait(timeout=10)
    exe = find_redis_server_binary()
    assert exe is not None
    args = [exe, "--port", str(server.port), "--bind", "127.0.0.1", "--save", ""]
    args += ["--appendonly", "no", "--dir", server.workdir or "/tmp", "--daemonize", "no"]
    server.process = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )

    def up() -> bool:
        try:
            return bool(server.client().ping())
        except Exception:
            return False

    wait_until(up, 10, what="redis-server back")


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = start_redis_server()
    try:
        yield server
    finally:
        server.stop()


def test_redis_restart_fail_closed(redis_server: RedisServer, own_redis: RedisServer) -> None:
    session = redis_server.url(0)
    chaos = Chaos(
        sem_url=own_redis.url(0), broker_url=session, backend_url=session, limit=2, lease=LEASE
    )
    node = start_worker(chaos.env, concurrency=4, name="r")
    try:
        state_key = chaos.semaphore().keys.state
        for _ in range(2):
            chaos.send("ok", 6.0)
        for _ in range(10):
            chaos.send("ok", 0.3)
        wait_until(lambda: len(chaos.running()) == 2, 60, what="two long bodies run")
        wait_until(lambda: own_redis.client().hget(state_key, "boot"), 10, what="marker seen")
        time.sleep(1.2)  # one more sweep, so every process has seen the marker
        _restart(own_redis)
        restarted = time.time()
        wait_until(
            lambda: any(e.event == "start" and e.at > restarted for e in chaos.rec.ledger()),
            LEASE + 30,
            what="a new body starts after the restart",
        )
        first = min(e.at for e in chaos.rec.ledger() if e.event == "start" and e.at > restarted)
        measure(
            "Redis restarted (state lost)",
            "first new grant (fail_closed, lease 4 s)",
            first - restarted,
        )
        report = chaos.assert_promise([node], results_within=90)
        measure("Redis restarted (state lost)", "all 12 tasks done", time.time() - restarted)
        assert report.states["SUCCESS"] == 12
        assert node.process.poll() is None, "the worker died"
        log = node.log()
        assert "its state in Redis was lost" in log
        assert "re-asserted the permit of" in log
        assert "permit LOST" not in log
    finally:
        node.stop()
        chaos.close()
        client = redis_server.client(0)
        delete_prefix(client, chaos.env.prefix)
        client.delete(chaos.env.queue)
        client.close()


def test_restart_settings_are_validated_at_worker_start() -> None:
    from celery import Celery

    from celery_semaphore.integration import config

    app = Celery("x", set_as_current=False)
    app.conf.update(semaphore_restart_policy="fail_closed", semaphore_restart_quarantine=5.0)
    checked = config.validate_app_settings(app.conf)
    assert checked["semaphore_restart_policy"] == "fail_closed"
    app.conf.update(semaphore_restart_policy="closed")
    with pytest.raises(ValueError, match=r"semaphore_restart_policy='closed'.*fail_closed"):
        config.validate_app_settings(app.conf)
    app.conf.update(semaphore_restart_policy="fail_open", semaphore_restart_quarantine=-1)
    with pytest.raises(ValueError, match="semaphore_restart_quarantine"):
        config.validate_app_settings(app.conf)
