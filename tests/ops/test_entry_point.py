"""The real ``celery`` executable finds ``semaphore`` through the ``celery.commands`` entry
point that ``pip install`` registers, and runs it (list, errors, the standalone exporter)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import suppress
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from celery_semaphore.ops import cli
from tests.conftest import SemaphoreFactory

from .test_cli import closed_port, owner

ROOT = Path(__file__).resolve().parents[2]
CELERY = Path(sys.executable).parent / "celery"

pytestmark = pytest.mark.timeout(120)


def test_the_entry_point_is_registered() -> None:
    [ep] = [ep for ep in entry_points(group="celery.commands") if ep.name == "semaphore"]
    assert ep.value == "celery_semaphore.ops.cli:semaphore"
    assert ep.load() is cli.semaphore


def celery_env(redis_url: str, prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update(CS_REDIS=redis_url, CS_PREFIX=prefix, PYTHONPATH=str(ROOT))
    return env


def run_celery(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    assert CELERY.exists(), f"no celery executable next to {sys.executable}"
    return subprocess.run(
        [str(CELERY), "-A", "tests.integration.proj", "semaphore", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_celery_executable_runs_semaphore_list(
    redis_url: str, key_prefix: str, make_semaphore: SemaphoreFactory
) -> None:
    make_semaphore("one", 1).acquire(owner=owner("t1"))
    out = run_celery(celery_env(redis_url, key_prefix), "list", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert (rows["main"]["limit"], rows["main"]["source"]) == (2, "code")
    assert (rows["one"]["limit"], rows["one"]["used"]) == (1, 1)
    assert "tests.integration.proj.work" in rows["main"]["tasks"]


def test_the_celery_executable_reports_unreachable_redis_in_one_line(key_prefix: str) -> None:
    env = celery_env(f"redis://127.0.0.1:{closed_port()}/0", key_prefix)
    out = run_celery(env, "show", "main")
    assert out.returncode == cli.EXIT_REDIS
    assert out.stderr.count("\n") == 1
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith("celery semaphore: error: cannot reach Redis at redis://")


@pytest.fixture
def exporter(redis_url: str, key_prefix: str) -> Iterator[str]:
    port = closed_port()
    args = [str(CELERY), "-A", "tests.integration.proj", "semaphore", "metrics"]
    proc = subprocess.Popen(
        [*args, "--port", str(port), "--address", "127.0.0.1"],
        cwd=ROOT,
        env=celery_env(redis_url, key_prefix),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        yield url
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()


def scrape(url: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return str(response.read().decode())
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_the_standalone_exporter_serves_the_gauges(
    exporter: str, make_semaphore: SemaphoreFactory
) -> None:
    make_semaphore("main", 2).acquire(owner=owner("t1"))
    text = scrape(exporter)
    assert 'celery_semaphore_limit{semaphore="main"} 2.0' in text
    assert 'celery_semaphore_in_use{semaphore="main"} 1.0' in text
    assert 'celery_semaphore_limit{semaphore="one"} 1.0' in text
    assert "celery_semaphore_redis_up 1.0" in text
