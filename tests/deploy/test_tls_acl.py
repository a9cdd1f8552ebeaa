"""TLS (a throwaway CA and certificates made with ``openssl``, a redis-server listening only on
``--tls-port``) and an ACL user whose keys are confined to the key prefix.  A wrong password
or a wrong certificate gives one clear line naming the URL without the password."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_semaphore import Semaphore, SemaphoreBackendError
from celery_semaphore.core.connection import check, redis_client
from celery_semaphore.integration.config import redis_settings
from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix
from tests.integration import proj
from tests.integration.helpers import max_inside, ran
from tests.integration.workers import Env, start_worker

from .servers import TlsServer, redis_tls

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

PASSWORD = "s3cret-Pa55"
PREFIX = "cstls"


@pytest.fixture(scope="module")
def tls() -> Iterator[TlsServer]:
    with redis_tls(auth_clients=False) as server:
        admin = redis_client(server.url(), options={"ssl_ca_certs": str(server.files.ca)})
        # the application user of docs/recipes.md: only keys under its prefix, no admin or
        # dangerous commands
        admin.execute_command(
            "ACL",
            "SETUSER",
            "app",
            "on",
            f">{PASSWORD}",
            f"~{PREFIX}:*",
            "resetchannels",
            "+@all",
            "-@admin",
            "-@dangerous",
        )
        admin.close()
        yield server


@pytest.fixture(scope="module")
def mtls() -> Iterator[TlsServer]:
    with redis_tls(auth_clients=True) as server:
        yield server


def _one_line(text: str) -> None:
    assert "\n" not in text.strip(), text


def test_rediss_with_ca_and_acl_user_runs_every_operation(tls: TlsServer) -> None:
    client = redis_client(tls.url("app", PASSWORD), options={"ssl_ca_certs": str(tls.files.ca)})
    sem = Semaphore("tls", 1, redis=client, key_prefix=PREFIX, poll_interval=1.5)
    try:
        holder = sem.acquire(blocking=False)
        assert holder is not None
        got: list[Any] = []
        thread = threading.Thread(target=lambda: got.append(sem.acquire(timeout=10)))
        thread.start()
        deadline = time.monotonic() + 5
        while not sem.waiters() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(sem.waiters()) == 1
        assert holder.refresh() is True
        holder.release()
        thread.join(timeout=10)
        assert got[0] is not None
        got[0].release()
        snap = sem.inspect()
        assert snap.used == 0
        assert snap.holders == []
        # the ACL user can touch nothing outside its prefix: the semaphore stayed inside it
        with pytest.raises(SemaphoreBackendError, match="no permissions to access one of the keys"):
            Semaphore("tls", 1, redis=client, key_prefix="elsewhere").acquire(blocking=False)
    finally:
        delete_prefix(client, PREFIX)
        client.close()


def test_settings_reach_the_tls_server(tls: TlsServer) -> None:
    app = Celery("tls", set_as_current=False)
    app.conf.update(
        semaphore_redis_url=tls.url("app", PASSWORD),
        semaphore_redis_options={"ssl_ca_certs": str(tls.files.ca), "ssl_cert_reqs": "required"},
    )
    settings = redis_settings(app.conf)
    check(settings.url, options=settings.options)  # no error


def test_wrong_password_is_one_line_without_the_password(tls: TlsServer) -> None:
    url = tls.url("app", "not-the-password")
    options = {"ssl_ca_certs": str(tls.files.ca)}
    with pytest.raises(ValueError, match="rejected the credentials") as info:
        check(url, options=options)
    message = str(info.value)
    _one_line(message)
    assert f"Redis at rediss://app:***@127.0.0.1:{tls.port}/0 rejected" in message
    assert "not-the-password" not in message
    sem = Semaphore("tls", 1, redis=url + "?ssl_ca_certs=" + str(tls.files.ca), key_prefix=PREFIX)
    with pytest.raises(SemaphoreBackendError) as backend:
        sem.acquire(blocking=False)
    _one_line(str(backend.value))
    assert "not-the-password" not in str(backend.value)
    assert "rediss://app:***@127.0.0.1" in str(backend.value)


def test_unknown_ca_is_one_clear_line(tls: TlsServer) -> None:
    with pytest.raises(ValueError, match="certificate verify failed") as info:
        check(tls.url("app", PASSWORD), options={"ssl_ca_certs": str(tls.files.other_ca)})
    _one_line(str(info.value))
    assert PASSWORD not in str(info.value)


def test_plain_redis_url_against_a_tls_port_is_reported(
    tls: TlsServer, caplog: pytest.LogCaptureFixture
) -> None:
    # the server waits for a TLS handshake, the client for a reply: to the client this looks
    # like a Redis that does not answer, so it is a warning (see troubleshooting), not silence
    with caplog.at_level(logging.WARNING, logger="celery_semaphore.config"):
        check(f"redis://127.0.0.1:{tls.port}/0", options={"socket_timeout": 1.0})
    [record] = caplog.records
    assert f"Redis at redis://127.0.0.1:{tls.port}/0 is not reachable now" in record.getMessage()


def test_mutual_tls_needs_the_client_certificate(mtls: TlsServer) -> None:
    base = {"ssl_ca_certs": str(mtls.files.ca)}
    with_cert = {
        **base,
        "ssl_certfile": str(mtls.files.client_cert),
        "ssl_keyfile": str(mtls.files.client_key),
    }
    check(mtls.url(), options=with_cert)
    client = redis_client(mtls.url(), options=with_cert)
    prefix = f"csmtls-{uuid.uuid4().hex[:6]}"
    try:
        with Semaphore("m", 1, redis=client, key_prefix=prefix, timeout=5) as permit:
            assert permit.fencing_token == 1
    finally:
        delete_prefix(client, prefix)
        client.close()
    with pytest.raises(ValueError, match="cannot use Redis at rediss://") as info:
        check(mtls.url(), options=base)
    _one_line(str(info.value))


def test_worker_with_a_wrong_password_stops_with_one_line(
    tls: TlsServer, redis_server: RedisServer
) -> None:
    url = redis_server.url(0)
    env = Env(
        redis_url=url,
        broker_url=url,
        extra={
            "semaphore_redis_url": tls.url("app", "wrong-pw"),
            "semaphore_redis_options": {"ssl_ca_certs": str(tls.files.ca)},
        },
    )
    node = start_worker(env, concurrency=1, wait=False)
    try:
        try:
            code = node.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker kept running:\n{node.log()[-2000:]}")
        assert code != 0
        text = node.output() + node.log()
        lines = [line for line in text.splitlines() if "rejected the credentials" in line]
        assert lines, text[-2000:]
        assert "Redis at rediss://app:***@127.0.0.1" in lines[0]
        assert len(lines) == 1  # said once
        assert "wrong-pw" not in text
        assert "ready." not in node.log()
    finally:
        node.stop(timeout=5)
        client = redis_server.client(0)
        delete_prefix(client, env.prefix)
        client.delete(env.queue)
        client.close()


def test_worker_round_trip_over_tls_as_a_confined_acl_user(
    tls: TlsServer, redis_server: RedisServer
) -> None:
    url = redis_server.url(0)
    env = Env(redis_url=url, broker_url=url, limit=2)
    admin = redis_client(tls.url(), options={"ssl_ca_certs": str(tls.files.ca)})
    user = f"worker-{env.prefix}"
    admin.execute_command(
        "ACL",
        "SETUSER",
        user,
        "on",
        f">{PASSWORD}",
        f"~{env.prefix}:*",
        "resetchannels",
        "+@all",
        "-@admin",
        "-@dangerous",
    )
    env.extra = {
        "semaphore_redis_url": tls.url(user, PASSWORD),
        "semaphore_redis_options": {"ssl_ca_certs": str(tls.files.ca)},
    }
    node = start_worker(env, concurrency=3, name="tls")
    try:
        app = env.client_app()
        results = [app.send_task(proj.work.name, (f"s{i}", 0.1)) for i in range(8)]
        assert [r.get(timeout=60) for r in results] == [f"s{i}" for i in range(8)]
        app.close()
        assert max_inside(env) == env.limit
        assert sorted(ran(env)) == sorted(f"s{i}" for i in range(8))
        sem = Semaphore("main", env.limit, redis=admin, key_prefix=env.prefix)
        assert int(admin.hget(sem.keys.state, "fence") or 0) >= 8  # granted on the TLS server
        assert sem.inspect().holders == []
        # the ACL refuses any key outside the prefix (NOPERM): the semaphore, the registry
        # and the gate's wake lists all live under it, or the log would show the refusal
        problems = [
            line
            for line in node.log().splitlines()
            if "WARNING/" in line or "ERROR/" in line or "CRITICAL/" in line
        ]
        assert problems == []
    finally:
        node.stop()
        delete_prefix(admin, env.prefix)
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()
        local = redis_server.client(0)
        delete_prefix(local, env.prefix)
        local.delete(env.queue)
        local.close()
