"""celery_semaphore.core.connection: settings to a redis-py client, checked early, never leaking a
password.  (Cluster, Sentinel and TLS servers are exercised in tests/deploy/.)"""

from __future__ import annotations

import logging
import socket
from typing import Any

import pytest
import redis
from redis.sentinel import SentinelConnectionPool

from celery_semaphore import Semaphore
from celery_semaphore.core.connection import (
    WORKER_DEFAULTS,
    check,
    describe_client,
    redis_client,
    safe_url,
    validate,
)
from celery_semaphore.core.exceptions import SemaphoreBackendError
from celery_semaphore.integration.config import redis_settings


def test_safe_url_hides_every_password() -> None:
    assert safe_url("redis://u:s3cret@h:1/0") == "redis://u:***@h:1/0"
    assert safe_url("sentinel://:pw@a:26379;sentinel://:pw2@b:26379") == (
        "sentinel://:***@a:26379;sentinel://:***@b:26379"
    )
    assert safe_url("redis://h:1/0") == "redis://h:1/0"


@pytest.mark.parametrize(
    ("url", "cluster", "options", "needle"),
    [
        ("http://h", False, None, "the URL scheme must be one of"),
        ("redis://", False, None, "the URL has no host"),
        ("redis://a:1;redis://b:1", False, None, "only for sentinel:// or a Redis Cluster"),
        ("sentinel://a:1;redis://b:1", False, {"master_name": "m"}, "the same scheme"),
        ("redis://a:7000/2", True, None, "only database 0"),
        ("unix:///tmp/x.sock", True, None, "use redis:// or rediss:// URLs"),
        ("sentinel://a:26379", False, None, "add 'master_name'"),
        ("redis://a:1", False, {"master_name": "m"}, "only apply to sentinel:// URLs"),
        ("redis://a:1", False, {"ssl_ca_cert": "x"}, "unknown key 'ssl_ca_cert'"),
        ("redis://a:1", False, {"ssl_ca_certs": "/nonexistent/ca.pem"}, "no such file"),
        ("redis://a:1", False, {"socket_timeout": 0}, "seconds > 0"),
        ("redis://a:1", False, {"socket_timeout": True}, "seconds >= 0"),
        ("redis://a:1", False, {"retries": -1}, "an int >= 0"),
        ("redis://a:1", False, {"ssl_cert_reqs": "yes"}, "'none', 'optional', 'required'"),
        ("redis://a:1", False, {"ssl": "yes"}, "True or False"),
        ("redis://a:1", False, {"protocol": 1}, "2 or 3"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(
    url: str, cluster: bool, options: Any, needle: str
) -> None:
    with pytest.raises(ValueError, match="semaphore_redis_") as info:
        validate(url, cluster=cluster, options=options)
    assert needle in str(info.value)


def test_wrong_types_are_refused() -> None:
    with pytest.raises(TypeError, match="semaphore_redis_cluster must be True or False"):
        validate("redis://a:1", cluster="yes")
    with pytest.raises(TypeError, match="must be a dict of redis-py connection options"):
        validate("redis://a:1", options=["ssl"])


def test_a_password_never_appears_in_a_validation_error() -> None:
    with pytest.raises(ValueError, match="only for sentinel") as info:
        validate("redis://u:hunter2@a:1;redis://u:hunter2@b:1")
    assert "hunter2" not in str(info.value)


def test_worker_defaults_bound_a_hung_redis() -> None:
    client = redis_client("redis://127.0.0.1:1/0")
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == WORKER_DEFAULTS["socket_timeout"]
    assert kwargs["socket_connect_timeout"] == WORKER_DEFAULTS["socket_connect_timeout"]
    assert client.get_retry().get_retries() == WORKER_DEFAULTS["retries"]
    # user options win over the defaults
    tuned = redis_client("redis://127.0.0.1:1/0", options={"socket_timeout": 7.5, "retries": 0})
    assert tuned.connection_pool.connection_kwargs["socket_timeout"] == 7.5
    assert tuned.get_retry().get_retries() == 0


def test_sentinel_url_gives_a_master_following_client() -> None:
    client = redis_client(
        "sentinel://:masterpw@127.0.0.1:26399/3;sentinel://127.0.0.1:26398",
        options={"master_name": "mymaster", "sentinel_kwargs": {"password": "sentpw"}},
    )
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "mymaster"
    assert pool.connection_kwargs["password"] == "masterpw"
    assert pool.connection_kwargs["db"] == 3
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [26399, 26398]
    assert sentinels[0].connection_pool.connection_kwargs["password"] == "sentpw"
    assert describe_client(client) == "Sentinel master 'mymaster'"


def test_sentinel_broker_is_used_with_its_transport_options() -> None:
    from celery import Celery

    app = Celery("x", broker="sentinel://127.0.0.1:26399/0", set_as_current=False)
    app.conf.broker_transport_options = {"master_name": "mymaster"}
    settings = redis_settings(app.conf)
    assert settings.url == "sentinel://127.0.0.1:26399/0"
    assert settings.options["master_name"] == "mymaster"


def test_describe_client_never_shows_the_password() -> None:
    client = redis_client("rediss://app:hunter2@127.0.0.1:1/2")
    assert describe_client(client) == "rediss://app@127.0.0.1:1/2"
    assert describe_client(redis_client("unix:///tmp/r.sock?db=1")) == "unix:///tmp/r.sock?db=1"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_check_passes_on_a_working_redis(redis_url: str) -> None:
    check(redis_url)


def test_check_only_warns_when_redis_is_down(caplog: pytest.LogCaptureFixture) -> None:
    url = f"redis://u:hunter2@127.0.0.1:{_closed_port()}/0"
    with caplog.at_level(logging.WARNING, logger="celery_semaphore.config"):
        check(url)
    [record] = caplog.records
    assert "is not reachable now" in record.getMessage()
    assert "hunter2" not in record.getMessage()


def test_backend_error_names_the_url_without_password() -> None:
    port = _closed_port()
    sem = Semaphore("x", 1, redis=f"redis://u:hunter2@127.0.0.1:{port}/0")
    with pytest.raises(SemaphoreBackendError) as info:
        sem.acquire(blocking=False)
    message = str(info.value)
    assert f"Redis at redis://u:***@127.0.0.1:{port}/0 failed" in message
    assert "hunter2" not in message
    assert "\n" not in message


def test_backend_error_with_a_client_names_where_it_points() -> None:
    port = _closed_port()
    client = redis.Redis(host="127.0.0.1", port=port, password="hunter2", socket_timeout=1)
    sem = Semaphore("x", 1, redis=client)
    with pytest.raises(SemaphoreBackendError) as info:
        sem.inspect()
    assert f"Redis at redis://127.0.0.1:{port}/0 failed" in str(info.value)
    assert "hunter2" not in str(info.value)
