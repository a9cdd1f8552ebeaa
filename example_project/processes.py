"""The demo's child processes: ``celery worker`` nodes, each in a process group of its own.

Every process is started with ``start_new_session=True`` and stopped by signalling its group
(by PID), so a pool's children go with it and nothing else is touched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class WorkerProcess:
    name: str
    pool: str
    concurrency: int
    process: subprocess.Popen[bytes]
    logfile: Path

    def log_tail(self, chars: int = 3000) -> str:
        text = self.logfile.read_text(errors="replace") if self.logfile.exists() else ""
        return text[-chars:]

    def signal(self, sig: int) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def stop(self, timeout: float = 15.0) -> None:
        """Warm shutdown (SIGTERM to the group), then SIGKILL whatever is left of it."""
        if self.process.poll() is None:
            self.signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        self.signal(signal.SIGKILL)  # pool children may outlive the main process
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)


def start_worker(
    pool: str,
    concurrency: int,
    queues: list[str],
    env: Mapping[str, str],
    logdir: Path,
) -> WorkerProcess:
    """Start ``celery -A example_project.app worker`` (do not wait for it: see
    :func:`wait_ready`)."""
    name = f"{pool}-{uuid.uuid4().hex[:6]}@localhost"
    logfile = logdir / f"{name.split('@')[0]}.log"
    args = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "example_project.app",
        "worker",
        "-P",
        pool,
        "-c",
        str(concurrency),
        "-n",
        name,
        "-Q",
        ",".join(queues),
        "--without-gossip",
        "--without-mingle",
        "-l",
        "INFO",
        "--logfile",
        str(logfile),
    ]
    with (logdir / f"{name.split('@')[0]}.out").open("wb") as out:
        process = subprocess.Popen(
            args,
            env={**env, "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")},
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return WorkerProcess(name, pool, concurrency, process, logfile)


def wait_ready(app: Any, workers: list[WorkerProcess], timeout: float) -> None:
    """Wait until every worker answers a ``ping`` (raise with its log if it exits or is
    not ready in time)."""
    deadline = time.monotonic() + timeout
    waiting = {w.name: w for w in workers}
    while waiting:
        for worker in waiting.values():
            if worker.process.poll() is not None:
                raise RuntimeError(
                    f"worker {worker.name} exited with status {worker.process.returncode}:\n"
                    f"{worker.log_tail()}"
                )
        if time.monotonic() > deadline:
            names = ", ".join(waiting)
            raise TimeoutError(f"workers not ready within {timeout:.0f} s: {names}")
        for reply in app.control.ping(destination=list(waiting), timeout=0.5) or []:
            for name in reply:
                waiting.pop(name, None)
