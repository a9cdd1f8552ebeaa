"""``unix://`` URLs: the settings reach a redis-server listening only on a Unix socket."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_semaphore import Semaphore
from celery_semaphore.core.connection import check, describe_client, redis_client
from celery_semaphore.integration.config import redis_settings

from .servers import Processes, processes, require_binaries, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


@pytest.fixture
def socket_path() -> Iterator[Path]:
    bins = require_binaries("redis-server")
    group: Processes
    with processes("cs-unix-") as group:
        path = group.workdir / "redis.sock"
        proc = group.spawn(
            [
                bins["redis-server"],
                "--port",
                "0",
                "--unixsocket",
                str(path),
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(group.workdir),
            ],
            "unix",
        )

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited:\n{group.log('unix')}")
            client = redis.Redis(unix_socket_path=str(path), socket_timeout=1)
            try:
                return bool(client.ping())
            finally:
                client.close()

        wait_for(up, 20, "redis-server answers on its Unix socket")
        yield path


def test_unix_socket_settings_run_every_operation(socket_path: Path) -> None:
    app = Celery("unix", set_as_current=False)
    app.conf.update(semaphore_redis_url=f"unix://{socket_path}?db=2")
    settings = redis_settings(app.conf)
    check(settings.url, options=settings.options)
    client = redis_client(settings.url, options=settings.options)
    try:
        assert describe_client(client) == f"unix://{socket_path}?db=2"
        sem = Semaphore("u", 1, redis=client, key_prefix="csunix")
        with sem.hold(timeout=5) as permit:
            assert sem.acquire(blocking=False) is None
            assert permit.refresh() is True
        assert sem.inspect().used == 0
        assert client.connection_pool.connection_kwargs["db"] == 2
        assert client.exists(sem.keys.state) == 1  # written in database 2 of that server
    finally:
        client.close()
