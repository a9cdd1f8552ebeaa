"""The pytest plugin (``celery_semaphore.pytest``, docs/testing.md), used as a user would.

* Here, through this project's conftest (which loads the plugin and hands it the session's
  Redis): its fixtures run a real embedded worker on real Redis, and the recorder's count is
  checked against bodies that meet at a barrier, so the exact maximum is known without a
  sleep; with the semaphore turned off the same count exceeds the limit.
* In a plain project made by ``pytester`` (no conftest of ours, pytest-celery's plugin loaded
  as it is by default), in a subprocess: a user's test file passes, and its assertions fail
  when the limit is exceeded or a permit is left held.
* Loading the plugin has no side effects, and its fixture names clash with none of Celery's,
  pytest-celery's or this project's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from celery import Celery

from celery_semaphore import LimitedTask, Semaphore, limited
from celery_semaphore.ops.recording import BodyRecorder
from celery_semaphore.ops.testing import RedisServer

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
#: plugins an in-process pytester run does without (hypothesis's summary alone takes seconds)
QUIET = ("-p", "no:celery", "-p", "no:cacheprovider", "-p", "no:hypothesispytest")
LIMIT = 2
RUNS = 8


# -- through this project's conftest ----------------------------------------------------------


@pytest.fixture
def meet() -> int:
    """How many bodies wait for each other at the barrier before going on."""
    return LIMIT


@pytest.fixture
def barrier(meet: int) -> Iterator[threading.Barrier]:
    b = threading.Barrier(meet, timeout=20)
    yield b
    b.abort()  # a body still waiting (a failed test) gets out at once


@pytest.fixture
def semaphore_app(semaphore_app: Celery, barrier: threading.Barrier) -> Celery:
    """The plugin's app, with limited tasks registered before the worker starts."""

    @semaphore_app.task(name="plugin.call_api", shared=False)
    @limited("api", limit=LIMIT)
    def call_api(i: int) -> int:
        barrier.wait()  # LIMIT bodies meet here: the maximum is reached on every run
        return i

    @semaphore_app.task(name="plugin.per_customer", shared=False)
    @limited("customer:{customer_id}", limit=1)
    def per_customer(customer_id: int) -> int:
        return customer_id

    class Transcode(LimitedTask):
        name = "plugin.transcode"
        semaphore_name = "gpu"
        semaphore_limit = 1

        def run(self, i: int) -> int:
            return i

    semaphore_app.register_task(Transcode())

    # Celery puts its own retrying run() around ours (task._orig_run) for autoretry_for
    @semaphore_app.task(name="plugin.flaky", shared=False, autoretry_for=(KeyError,), max_retries=1)
    @limited("flaky", limit=1)
    def flaky(i: int) -> int:
        return i

    return semaphore_app


def test_a_limit_of_2_on_a_worker_with_4_threads(
    semaphore_app: Celery, semaphore_worker: Any, semaphore_recorder: BodyRecorder
) -> None:
    call_api = semaphore_app.tasks["plugin.call_api"]
    results = [call_api.delay(i) for i in range(RUNS)]
    assert [r.get(timeout=60) for r in results] == list(range(RUNS))
    assert semaphore_recorder.max_concurrency("api") <= LIMIT
    assert semaphore_recorder.max_concurrency("api") == LIMIT  # under load, the limit is used
    assert semaphore_recorder.max_units("api") == LIMIT
    assert semaphore_recorder.bodies("api") == RUNS
    assert semaphore_recorder.running("api") == 0
    assert semaphore_recorder.names() == ["api"]
    assert semaphore_recorder.no_permits_held()


def test_class_based_tasks_are_recorded_too(
    semaphore_app: Celery, semaphore_worker: Any, semaphore_recorder: BodyRecorder
) -> None:
    transcode = semaphore_app.tasks["plugin.transcode"]
    assert [transcode.delay(i).get(timeout=30) for i in range(3)] == [0, 1, 2]
    assert semaphore_recorder.bodies("gpu") == 3
    assert semaphore_recorder.max_concurrency("gpu") == 1
    assert semaphore_recorder.no_permits_held()


def test_tasks_with_autoretry_for_are_recorded_too(
    semaphore_app: Celery, semaphore_worker: Any, semaphore_recorder: BodyRecorder
) -> None:
    flaky = semaphore_app.tasks["plugin.flaky"]
    assert [flaky.delay(i).get(timeout=30) for i in range(2)] == [0, 1]
    assert semaphore_recorder.bodies("flaky") == 2
    assert semaphore_recorder.no_permits_held()


def test_names_made_from_arguments_are_counted_by_name(
    semaphore_app: Celery, semaphore_worker: Any, semaphore_recorder: BodyRecorder
) -> None:
    per_customer = semaphore_app.tasks["plugin.per_customer"]
    results = [per_customer.delay(c) for c in (1, 2, 1, 1)]
    assert [r.get(timeout=30) for r in results] == [1, 2, 1, 1]
    assert semaphore_recorder.names() == ["customer:1", "customer:2"]
    assert semaphore_recorder.bodies("customer:1") == 3
    assert semaphore_recorder.max_concurrency("customer:1") == 1
    assert semaphore_recorder.bodies("customer:{customer_id}") == 0  # a template runs nothing
    check = semaphore_recorder.no_permits_held()
    assert check
    assert {"customer:1", "customer:2"} <= set(check.checked)


class TestWithTheSemaphoreOff:
    """The count is the recorder's own: bodies the semaphore did not limit exceed it."""

    @pytest.fixture
    def meet(self) -> int:
        return LIMIT + 1

    @pytest.fixture
    def semaphore_config(self, semaphore_config: dict[str, Any]) -> dict[str, Any]:
        return {**semaphore_config, "semaphore_enabled": False}

    def test_the_recorder_sees_the_limit_exceeded(
        self, semaphore_app: Celery, semaphore_worker: Any, semaphore_recorder: BodyRecorder
    ) -> None:
        call_api = semaphore_app.tasks["plugin.call_api"]
        results = [call_api.delay(i) for i in range(LIMIT + 1)]
        assert [r.get(timeout=60) for r in results] == list(range(LIMIT + 1))
        assert semaphore_recorder.max_concurrency("api") == LIMIT + 1


class TestPrefork:
    """Bodies run in pool processes forked from this one are counted (in Redis)."""

    @pytest.fixture
    def semaphore_worker_parameters(self) -> dict[str, Any]:
        return {"pool": "prefork", "concurrency": 2}

    def test_bodies_in_child_processes_are_counted(
        self, semaphore_app: Celery, semaphore_worker: Any, semaphore_recorder: BodyRecorder
    ) -> None:
        transcode = semaphore_app.tasks["plugin.transcode"]
        results = [transcode.delay(i) for i in range(4)]
        assert [r.get(timeout=60) for r in results] == [0, 1, 2, 3]
        assert semaphore_recorder.bodies("gpu") == 4
        assert semaphore_recorder.max_concurrency("gpu") == 1
        assert semaphore_recorder.no_permits_held()


def test_no_permits_held_names_a_permit_left_held(
    semaphore_app: Celery,
    semaphore_recorder: BodyRecorder,
    semaphore_redis_url: str,
    semaphore_key_prefix: str,
) -> None:
    sem = Semaphore("api", LIMIT, redis=semaphore_redis_url, key_prefix=semaphore_key_prefix)
    permit = sem.acquire(timeout=5)
    assert permit is not None
    check = semaphore_recorder.no_permits_held(timeout=0)
    assert not check
    assert list(check.held) == ["api"]
    assert permit.token in repr(check)
    permit.release()
    assert semaphore_recorder.no_permits_held(timeout=0)


def test_the_repo_conftest_hands_the_plugin_its_redis(
    semaphore_redis: RedisServer, redis_server: RedisServer, semaphore_redis_url: str
) -> None:
    assert semaphore_redis is redis_server
    assert semaphore_redis_url.startswith(f"redis://{redis_server.host}:{redis_server.port}/")


# -- the plugin's surface ---------------------------------------------------------------------


def _fixture_names(module: ModuleType) -> set[str]:
    from _pytest.fixtures import getfixturemarker

    names = set()
    for attr, value in vars(module).items():
        marker = getfixturemarker(value)
        if marker is not None:
            names.add(marker.name or attr)
    return names


def test_the_fixture_names_clash_with_none_of_celerys_pytest_celerys_or_ours() -> None:
    import celery.contrib.pytest

    import celery_semaphore.pytest
    import tests.conftest
    import tests.integration.conftest
    import tests.ops.conftest

    mine = _fixture_names(celery_semaphore.pytest)
    assert len(mine) == 8
    assert all(name.startswith("semaphore_") for name in mine), mine
    others = [celery.contrib.pytest, tests.conftest, tests.ops.conftest, tests.integration.conftest]
    try:
        import pytest_celery.plugin  # type: ignore[import-untyped]
    except ImportError:  # not installed: nothing to clash with
        pass
    else:
        others.append(pytest_celery.plugin)
    for module in others:
        theirs = _fixture_names(module)
        assert theirs, module  # the check sees fixtures at all
        # this project's conftest overrides semaphore_redis on purpose (the session's Redis)
        assert mine & theirs <= {"semaphore_redis"}, (module.__name__, mine & theirs)
    assert "celery_worker" in _fixture_names(celery.contrib.pytest)


def test_loading_the_plugin_has_no_side_effects() -> None:
    code = textwrap.dedent(
        """
        import sys, threading
        import celery_semaphore.pytest as plugin
        heavy = [m for m in ("celery", "kombu", "redis") if m in sys.modules]
        print(heavy, threading.active_count(), plugin.BodyRecorder.__name__)
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    # nothing heavy imported and no thread started until a fixture is used; the types
    # import Celery on first access
    assert out.stdout.split() == ["[]", "1", "BodyRecorder"]


# -- a user's project, made by pytester --------------------------------------------------------

USER_CONFTEST = """
import threading

import pytest
from celery import Celery

from celery_semaphore import limited


@pytest.fixture
def meet() -> int:
    return 2


@pytest.fixture
def semaphore_app(semaphore_app: Celery, meet: int) -> Celery:
    barrier = threading.Barrier(meet, timeout=20)

    @semaphore_app.task(name="user.call_api", shared=False)
    @limited("api", limit=2)
    def call_api(i: int) -> int:
        barrier.wait()
        return i

    return semaphore_app
"""

USER_TESTS = """
from celery_semaphore import Semaphore


def test_the_limit_holds(semaphore_app, semaphore_worker, semaphore_recorder):
    call_api = semaphore_app.tasks["user.call_api"]
    results = [call_api.delay(i) for i in range(4)]
    assert [r.get(timeout=30) for r in results] == [0, 1, 2, 3]
    assert semaphore_recorder.max_concurrency("api") <= 2
    assert semaphore_recorder.no_permits_held()
    assert semaphore_redis_is_ours(semaphore_worker)


def semaphore_redis_is_ours(worker):
    return worker.app.conf.semaphore_key_prefix.startswith("cstest-")


def test_a_permit_left_held(semaphore_app, semaphore_recorder, semaphore_redis_url,
                            semaphore_key_prefix):
    sem = Semaphore("api", 2, redis=semaphore_redis_url, key_prefix=semaphore_key_prefix)
    assert sem.acquire(timeout=5) is not None  # never released
    assert semaphore_recorder.no_permits_held(timeout=0)
"""

USER_BROKEN = """
import pytest


@pytest.fixture
def semaphore_config(semaphore_config):
    return {**semaphore_config, "semaphore_enabled": False}  # the limit is not enforced


@pytest.fixture
def meet():
    return 3


def test_the_limit_is_exceeded(semaphore_app, semaphore_worker, semaphore_recorder):
    call_api = semaphore_app.tasks["user.call_api"]
    results = [call_api.delay(i) for i in range(3)]
    assert [r.get(timeout=30) for r in results] == [0, 1, 2]
    assert semaphore_recorder.max_concurrency("api") <= 2
"""


USER_PROJ = """
from celery import Celery

from celery_semaphore import limited

app = Celery("proj")


@app.task(name="proj.work")
@limited("work", limit=1)
def work(i):
    return i
"""

USER_OWN_APP = """
import pytest


@pytest.fixture
def semaphore_app(semaphore_config):  # the docs' recipe: the project's own app
    from proj import app

    app.conf.update(semaphore_config)
    return app


@pytest.mark.parametrize("run", range(2))  # the same app, a new prefix and worker each time
def test_own_app(run, semaphore_app, semaphore_worker, semaphore_recorder):
    from proj import work

    assert [work.delay(i).get(timeout=30) for i in range(3)] == [0, 1, 2]
    assert semaphore_recorder.bodies("work") == 3
    assert semaphore_recorder.max_concurrency("work") == 1
    assert semaphore_recorder.no_permits_held()
"""


@pytest.fixture
def user_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The subprocess imports this checkout's package, and is told of no Redis."""
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), path]) if path else str(ROOT))
    monkeypatch.delenv("CELERY_SEMAPHORE_TEST_REDIS_URL", raising=False)


@pytest.mark.usefixtures("user_env")
def test_a_users_test_file_passes_and_its_assertions_can_fail(pytester: pytest.Pytester) -> None:
    """A plain project: no conftest of ours, pytest-celery's plugin loaded if installed, no
    Redis named (the plugin starts a throwaway redis-server); tests on fresh apps, and on the
    project's own app, reused from test to test."""
    pytester.makeconftest(USER_CONFTEST)
    pytester.makepyfile(
        proj=USER_PROJ, test_user=USER_TESTS, test_broken=USER_BROKEN, test_own_app=USER_OWN_APP
    )
    result = pytester.runpytest_subprocess(
        "-p", "celery_semaphore.pytest", "-p", "no:cacheprovider", timeout=180
    )
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(["*test_the_limit_is_exceeded*", "*assert 3 <= 2*"])
    result.stdout.fnmatch_lines(["*test_a_permit_left_held*", "*permits still held: 'api'*"])


def test_an_unreachable_redis_is_an_error_that_says_so(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_it(semaphore_redis_url):
            pass
        """
    )
    result = pytester.runpytest_inprocess(
        *QUIET, "-p", "celery_semaphore.pytest", "--semaphore-redis-url", "redis://127.0.0.1:1/0"
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*no Redis answers at redis://127.0.0.1:1/0*"])


def test_the_plugin_named_twice_reuses_a_given_redis(
    pytester: pytest.Pytester, redis_server: RedisServer
) -> None:
    """``-p`` and a conftest's ``pytest_plugins`` (as the entry point and a conftest would)
    register it once; beside Celery's own fixtures; a given URL is reused, not started."""
    url = redis_server.url(0)
    pytester.makeconftest('pytest_plugins = ("celery.contrib.pytest", "celery_semaphore.pytest")\n')
    pytester.makepyfile(
        f"""
        def test_it(semaphore_redis, semaphore_redis_url, semaphore_app, celery_app):
            assert not semaphore_redis.owned
            assert semaphore_redis_url == {url!r}
            assert semaphore_app.conf.semaphore_redis_url == {url!r}
            assert semaphore_app is not celery_app
        """
    )
    result = pytester.runpytest_inprocess(
        *QUIET, "-p", "celery_semaphore.pytest", "--semaphore-redis-url", url
    )
    result.assert_outcomes(passed=1)


def test_the_entry_point_loads_it_by_itself_and_no_disables_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer
) -> None:
    """The ``pytest11`` entry point of pyproject.toml, installed as a distribution on the
    path: it loads the plugin with no ``-p``; a conftest naming it too registers it once;
    ``-p no:celery_semaphore.pytest`` turns it off."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    points = project["project"]["entry-points"]["pytest11"]
    assert points == {"celery_semaphore.pytest": "celery_semaphore.pytest"}
    site = pytester.mkdir("site")
    info = site / "celery_semaphore_entry_point_check-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: celery-semaphore-entry-point-check\nVersion: 0\n"
    )
    lines = [f"{name} = {target}" for name, target in points.items()]
    (info / "entry_points.txt").write_text("[pytest11]\n" + "\n".join(lines) + "\n")
    monkeypatch.syspath_prepend(str(site))
    pytester.makepyfile(
        """
        def test_it(semaphore_config):
            assert semaphore_config["semaphore_key_prefix"].startswith("cstest-")
        """
    )
    args = (*QUIET, "--semaphore-redis-url", redis_server.url(0))
    off = pytester.runpytest_inprocess("-p", "no:celery_semaphore.pytest", *QUIET)
    off.assert_outcomes(errors=1)
    off.stdout.fnmatch_lines(["*fixture 'semaphore_config' not found*"])
    on = pytester.runpytest_inprocess(*args)
    on.assert_outcomes(passed=1)
    pytester.makeconftest('pytest_plugins = ["celery_semaphore.pytest"]\n')
    twice = pytester.runpytest_inprocess(*args)
    twice.assert_outcomes(passed=1)


def test_the_installed_distribution_registers_the_entry_point() -> None:
    """What ``pip install`` registered (run ``pip install -e .`` again after pyproject's entry
    points change)."""
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group="pytest11") if ep.value == "celery_semaphore.pytest"]
    assert [ep.name for ep in found] == ["celery_semaphore.pytest"], (
        "the installed celery-semaphore has no pytest11 entry point: reinstall it"
    )
