"""Settings reach the limiter however they are given, and bad ones stop things early.

* The same settings given through ``app.conf.update``, ``config_from_object`` (a class, a
  module) and Django's ``config_from_object(obj, namespace="CELERY")`` all take effect: a
  ``semaphore_limits`` entry overrides the limit written in code (an independent counter sees
  at most that many bodies at once), and ``semaphore_lease_ttl`` sets the holder's lease.
* ``semaphore_limits`` in a real worker caps a threads pool below the code's limit.
* An invalid value, or an unknown ``semaphore_*`` key (a typo), stops a real worker at start,
  with a message naming the setting; so does a renamed setting given under both its names.
* A renamed setting under its former name still works, and the worker's log warns of it once.
* Decoration-time mistakes raise at once, with a message showing the right form.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import types
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery import Celery
from celery._state import _set_task_join_will_block, task_join_will_block

from celery_semaphore import LimitedTask, Semaphore, limited
from celery_semaphore.integration.signals import _on_worker_init
from celery_semaphore.ops.testing import RedisServer
from tests.conftest import delete_prefix

from . import proj
from .helpers import holders, inside, max_inside, ran
from .workers import Env, start_worker

pytestmark = pytest.mark.timeout(90)

CODE_LIMIT = 2


# -- the same settings, four ways -------------------------------------------------------------


@dataclass
class Probe:
    """An independent count of bodies inside, and the lease each body saw."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    now: int = 0
    max: int = 0
    leases: list[float] = field(default_factory=list)


def _limited_app(app: Celery, probe: Probe, sem: Semaphore) -> Any:
    @app.task(shared=False)
    @limited("main", limit=CODE_LIMIT)
    def job(i: int) -> int:
        with probe.lock:
            probe.now += 1
            probe.max = max(probe.max, probe.now)
        probe.leases.extend(h.lease_remaining for h in sem.holders())
        time.sleep(0.1)
        with probe.lock:
            probe.now -= 1
        return i

    # finalize (and bind the task) here, not racily in the caller's threads
    app.finalize(auto=True)
    return app.tasks[job.name]


def _run_concurrently(job: Any, n: int = 8) -> list[int]:
    def call(i: int) -> int:
        result = job.delay(i)
        assert result.successful(), result.result
        return int(result.result)

    blocks = task_join_will_block()
    try:
        with ThreadPoolExecutor(4) as pool:
            return sorted(pool.map(call, range(n)))
    finally:
        _set_task_join_will_block(blocks)  # Task.apply() flips it process-wide


def _settings(redis_url: str, prefix: str) -> dict[str, Any]:
    return {
        "task_always_eager": True,
        "task_eager_propagates": True,
        "semaphore_redis_url": redis_url,
        "semaphore_key_prefix": prefix,
        "semaphore_eager_timeout": 20.0,
        "semaphore_limits": {"main": 1},
        "semaphore_lease_ttl": 7.0,
    }


def _conf_update(app: Celery, settings: dict[str, Any]) -> None:
    app.conf.update(settings)


def _from_class(app: Celery, settings: dict[str, Any]) -> None:
    app.config_from_object(type("Config", (), dict(settings)))


def _from_module(app: Celery, settings: dict[str, Any]) -> None:
    name = f"cs_test_settings_{uuid.uuid4().hex}"
    module = types.ModuleType(name)
    for key, value in settings.items():
        setattr(module, key, value)
    sys.modules[name] = module
    app.config_from_object(name)


def _django_namespace(app: Celery, settings: dict[str, Any]) -> None:
    django_settings = types.SimpleNamespace(
        **{f"CELERY_{key.upper()}": value for key, value in settings.items()}
    )
    app.config_from_object(django_settings, namespace="CELERY")


@pytest.fixture
def sem(redis_url: str, key_prefix: str) -> Semaphore:
    return Semaphore("main", CODE_LIMIT, redis=redis_url, key_prefix=key_prefix)


@pytest.mark.parametrize(
    "configure",
    [_conf_update, _from_class, _from_module, _django_namespace],
    ids=lambda f: f.__name__,
)
def test_settings_take_effect(
    configure: Any, redis_url: str, key_prefix: str, sem: Semaphore
) -> None:
    app = Celery(f"settings-{key_prefix}", set_as_current=False)
    configure(app, _settings(redis_url, key_prefix))
    probe = Probe()
    job = _limited_app(app, probe, sem)
    assert _run_concurrently(job) == list(range(8))
    assert probe.max == 1  # semaphore_limits {"main": 1} beat the code's limit of 2
    assert probe.leases
    assert all(0 < lease <= 7.0 for lease in probe.leases)  # semaphore_lease_ttl, not 60
    assert sem.holders() == []
    app.close()


def test_without_settings_the_code_limit_applies(
    redis_url: str, key_prefix: str, sem: Semaphore
) -> None:
    """The control for the test above: the same run reaches the code's limit of 2."""
    app = Celery(f"settings-{key_prefix}", set_as_current=False)
    settings = _settings(redis_url, key_prefix)
    del settings["semaphore_limits"], settings["semaphore_lease_ttl"]
    app.conf.update(settings)
    probe = Probe()
    job = _limited_app(app, probe, sem)
    assert _run_concurrently(job) == list(range(8))
    assert probe.max == CODE_LIMIT
    assert any(lease > 7.0 for lease in probe.leases)  # the 60 s default
    app.close()


def test_semaphore_limits_below_a_weight_fails_the_call(
    redis_url: str, key_prefix: str, sem: Semaphore
) -> None:
    """weight 2 <= the code's limit 2 passes at decoration; semaphore_limits {"main": 1} then
    makes every call fail with a ValueError naming the semaphore (the body never runs)."""
    app = Celery(f"settings-{key_prefix}", set_as_current=False)
    app.conf.update(_settings(redis_url, key_prefix))
    ran_bodies: list[int] = []

    @app.task(shared=False)
    @limited("main", limit=CODE_LIMIT, weight=2)
    def heavy(i: int) -> int:
        ran_bodies.append(i)
        return i

    with pytest.raises(ValueError, match="weight=2") as info:
        heavy.delay(1)
    assert "'main'" in str(info.value)
    assert ran_bodies == []
    assert sem.holders() == []
    app.close()


# -- a setting in a real worker ----------------------------------------------------------------


def test_semaphore_limits_in_a_real_worker(redis_server: RedisServer) -> None:
    """threads -c 4, code limit 2, semaphore_limits {"main": 1}: one body at a time."""
    url = redis_server.url(0)
    env = Env(redis_url=url, broker_url=url, limit=2, extra={"semaphore_limits": {"main": 1}})
    node = start_worker(env, pool="threads", concurrency=4)
    try:
        app = env.client_app()
        tags = [f"l{i}" for i in range(6)]
        results = [app.send_task(proj.work.name, (t, 0.15)) for t in tags]
        assert sorted(r.get(timeout=60) for r in results) == sorted(tags)
        assert max_inside(env) == 1
        assert inside(env) == 0
        assert sorted(ran(env)) == sorted(tags)
        assert holders(env) == []
    finally:
        node.stop()
        client = redis_server.client(0)
        delete_prefix(client, env.prefix)
        client.delete(env.queue)
        client.close()


# -- invalid settings stop a real worker -------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"semaphore_lease_ttl": -1}, "semaphore_lease_ttl"),
        # a typo: unknown setting
        ({"semaphore_lease_tll": 5}, "semaphore_lease_tll (did you mean semaphore_lease_ttl?)"),
        ({"semaphore_limits": {"main": 0}}, "semaphore_limits"),
        ({"semaphore_on_lease_lost": "ignore"}, "semaphore_on_lease_lost"),
        ({"semaphore_redis_options": {"ssl_ca_cert": "/x"}}, "unknown key 'ssl_ca_cert'"),
        (
            {"semaphore_redis_url": "sentinel://127.0.0.1:26379/0"},
            "semaphore_redis_options must name the Sentinel service",
        ),
        (
            {"semaphore_redis_url": "redis://127.0.0.1:7000/2", "semaphore_redis_cluster": True},
            "a cluster has only database 0",
        ),
        (
            {"semaphore_wait_timeout": 5.0, "semaphore_slot_wait_timeout": 2.0},
            "semaphore_wait_timeout=5.0 and semaphore_slot_wait_timeout=2.0 are both set",
        ),
        ({"semaphore_slot_waiters": 0}, "semaphore_slot_waiters=0 is not accepted"),
        (
            {"broker_transport_options": {"visibility_timeout": "soon"}},
            "broker_transport_options['visibility_timeout']='soon' is not accepted: use a "
            "number of seconds > 0",
        ),
    ],
    ids=[
        "negative-lease",
        "typo",
        "zero-limit",
        "bad-policy",
        "redis-option-typo",
        "sentinel-without-master",
        "cluster-db",
        "renamed-both-names",
        "new-name-bad-value",
        "visibility-timeout",
    ],
)
def test_invalid_setting_stops_the_worker(
    redis_server: RedisServer, extra: dict[str, Any], named: str
) -> None:
    url = redis_server.url(0)
    env = Env(redis_url=url, broker_url=url, extra=extra)
    node = start_worker(env, pool="prefork", concurrency=1, wait=False)
    try:
        try:
            code = node.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker kept running with {extra}:\n{node.log()[-2000:]}")
        text = node.output() + node.log()
        assert code != 0
        # said once: logged, and not printed again as the SystemExit (it was, twice)
        assert text.count("invalid configuration") == 1, text[-4000:]
        assert named in text, text[-2000:]
        assert "ready." not in node.log()  # it never started consuming
    finally:
        node.stop(timeout=5)
        client = redis_server.client(0)
        delete_prefix(client, env.prefix)
        client.delete(env.queue)
        client.close()


def test_renamed_settings_work_and_warn_once_in_the_worker_log(redis_server: RedisServer) -> None:
    """Former names start a worker (the tasks run) and its log warns once of each, naming the
    new name, as Celery warns of its own renamed settings."""
    url = redis_server.url(0)
    extra = {"semaphore_wait_timeout": 0.0, "semaphore_standby": 1, "semaphore_worker_hold": 0}
    env = Env(redis_url=url, broker_url=url, limit=1, extra=extra)
    node = start_worker(env, pool="threads", concurrency=2)
    try:
        app = env.client_app()
        results = [app.send_task(proj.work.name, (t, 0.05)) for t in ("r1", "r2")]
        assert sorted(r.get(timeout=60) for r in results) == ["r1", "r2"]
        text = node.output() + node.log()
        for old, new in [
            ("semaphore_wait_timeout", "semaphore_slot_wait_timeout"),
            ("semaphore_standby", "semaphore_slot_waiters"),
        ]:
            said = f"The {old!r} setting is deprecated"
            assert text.count(said) == 1, text[-4000:]
            assert f"{said} and will be removed in a future version; use {new!r}" in text
        assert "CDeprecationWarning" in text
    finally:
        node.stop()
        client = redis_server.client(0)
        delete_prefix(client, env.prefix)
        client.delete(env.queue)
        client.close()


def _start_worker_signal(app: Celery) -> None:
    """What ``worker_init`` does in a real worker (the handler celery_semaphore connects)."""
    _on_worker_init(sender=types.SimpleNamespace(app=app))


def test_django_namespace_invalid_value_stops_the_worker() -> None:
    app = Celery("django-bad", set_as_current=False)
    app.config_from_object(
        types.SimpleNamespace(
            CELERY_SEMAPHORE_REDIS_URL="redis://127.0.0.1:6379/0", CELERY_SEMAPHORE_LEASE_TTL=-1
        ),
        namespace="CELERY",
    )
    with pytest.raises(SystemExit, match="semaphore_lease_ttl"):
        _start_worker_signal(app)


def test_django_namespace_valid_settings_start() -> None:
    app = Celery("django-good", set_as_current=False)
    app.config_from_object(
        types.SimpleNamespace(
            CELERY_SEMAPHORE_REDIS_URL="redis://127.0.0.1:6379/0",
            CELERY_SEMAPHORE_LIMITS={"main": 1},
        ),
        namespace="CELERY",
    )
    _start_worker_signal(app)  # no SystemExit


def test_django_namespace_typo_stops_the_worker() -> None:
    app = Celery("django-typo", set_as_current=False)
    app.config_from_object(
        types.SimpleNamespace(
            CELERY_SEMAPHORE_REDIS_URL="redis://127.0.0.1:6379/0", CELERY_SEMAPHORE_LEASE_TLL=5
        ),
        namespace="CELERY",
    )
    with pytest.raises(SystemExit, match=r"(?i)semaphore_lease_tll"):
        _start_worker_signal(app)


# -- decoration-time errors --------------------------------------------------------------------


@pytest.fixture(params=["finalized", "lazy"])
def app(request: pytest.FixtureRequest) -> Iterator[Celery]:
    a = Celery(f"deco-{request.param}", set_as_current=False)
    if request.param == "finalized":
        a.finalize()
    yield a
    a.close()


def test_limited_above_the_task_decorator(app: Celery) -> None:
    with pytest.raises(TypeError) as info:

        @limited("x", limit=2)
        @app.task(shared=False)
        def wrong() -> None: ...

    message = str(info.value)
    assert "directly under the task decorator" in message
    assert "@app.task(bind=True)\n    @limited('x', limit=2)" in message  # the right form


def test_unknown_option() -> None:
    with pytest.raises(TypeError, match="unknown option") as info:
        limited("x", limit=2, lease_tll=5)(lambda: None)
    assert "lease_tll" in str(info.value)
    assert "lease_ttl" in str(info.value)  # the accepted ones are listed


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"limit": 2, "weight": 3}, ValueError, "weight=3"),
        ({"limit": 0}, ValueError, "limit"),
        ({"limit": "2"}, TypeError, "limit"),
        ({"limit": 2, "lease_ttl": -1}, ValueError, "lease_ttl"),
        ({"limit": 2, "on_lease_lost": "ignore"}, ValueError, "on_lease_lost"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], error: type[Exception], named: str) -> None:
    with pytest.raises(error, match=named):
        limited("x", **kwargs)(lambda: None)


def test_limited_twice() -> None:
    """Stacked @limited take several semaphores at once; the same one twice is refused."""

    @limited("a", limit=1)
    @limited("b", limit=1)
    def both() -> None: ...

    assert [m.name for m in both.__semaphore__.members] == ["b", "a"]  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="semaphore 'a' is named twice"):

        @limited("a", limit=1)
        @limited("a", limit=2)
        def twice() -> None: ...


def test_limited_task_without_a_name_or_limit() -> None:
    with pytest.raises(TypeError, match="needs semaphore_name and semaphore_limit"):

        class NoName(LimitedTask):
            semaphore_limit = 2

            def run(self) -> None: ...

    with pytest.raises(TypeError, match="needs semaphore_name and semaphore_limit"):

        class NoLimit(LimitedTask):
            semaphore_name = "x"

            def run(self) -> None: ...


def test_limited_task_unknown_attribute_and_bad_weight() -> None:
    with pytest.raises(TypeError, match="semaphore_lease_tll"):

        class Typo(LimitedTask):
            semaphore_name = "x"
            semaphore_limit = 2
            semaphore_lease_tll = 5

            def run(self) -> None: ...

    with pytest.raises(ValueError, match="weight=3"):

        class Heavy(LimitedTask):
            semaphore_name = "x"
            semaphore_limit = 2
            semaphore_weight = 3

            def run(self) -> None: ...


def test_base_limited_task_without_a_limit(app: Celery) -> None:
    """``base=LimitedTask`` options are checked when Celery builds the task class: at once
    on a finalized app, at finalization (a worker's start, or first use) on a lazy one."""

    def define_and_use() -> None:
        @app.task(shared=False, base=LimitedTask, semaphore_name="x")
        def no_limit() -> None: ...

        app.finalize()
        no_limit.name  # noqa: B018  (evaluate the lazy task)

    with pytest.raises(TypeError, match="needs semaphore_name and semaphore_limit"):
        define_and_use()
