"""Real ``celery worker`` subprocesses for the integration tests.

Each worker runs in its own process group (``start_new_session=True``); :meth:`Worker.stop`
signals only that group.  Readiness is a ``ping`` answered by the node, never a sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from kombu.exceptions import OperationalError

from celery_semaphore.ops.testing import delete_prefix

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Env:
    """Where one test's workers and client point."""

    redis_url: str
    broker_url: str
    prefix: str = field(default_factory=lambda: f"cstest-{uuid.uuid4().hex[:10]}")
    limit: int = 2
    lease: float = 60.0
    extra: dict[str, Any] = field(default_factory=dict)
    #: the module ``celery -A`` loads in the workers (its ``app``)
    app_module: str = "tests.integration.proj"
    #: more environment variables for the workers
    more_env: dict[str, str] = field(default_factory=dict)

    @property
    def queue(self) -> str:
        return f"{self.prefix}-q"

    def environ(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            CS_REDIS=self.redis_url,
            CS_BROKER=self.broker_url,
            CS_PREFIX=self.prefix,
            CS_QUEUE=self.queue,
            CS_LIMIT=str(self.limit),
            CS_LEASE=str(self.lease),
            CS_EXTRA=json.dumps(self.extra),
            PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        )
        env.update(self.more_env)
        return env

    def client_app(self) -> Celery:
        """A Celery app configured like the workers', for sending and control."""
        app = Celery("proj-client", broker=self.broker_url, backend=self.redis_url)
        app.conf.update(
            task_default_queue=self.queue,
            broker_connection_retry_on_startup=True,
            semaphore_redis_url=self.redis_url,
            semaphore_key_prefix=self.prefix,
        )
        app.conf.update(self.extra)  # may override the above
        return app

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url)


@dataclass
class Worker:
    name: str
    process: subprocess.Popen[bytes]
    logfile: Path
    #: the process's stdout and stderr (messages printed before logging is set up land here)
    outfile: Path | None = None

    def log(self) -> str:
        return self.logfile.read_text(errors="replace") if self.logfile.exists() else ""

    def output(self) -> str:
        """What the process wrote to stdout and stderr."""
        if self.outfile is None or not self.outfile.exists():
            return ""
        return self.outfile.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)

    def stop(self, timeout: float = 20.0) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL the group if it does not exit in time."""
        if self.process.poll() is None:
            self.signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        with suppress(ProcessLookupError):  # children may outlive the main process
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(timeout=10)

    def child_pids(self) -> list[int]:
        """The worker's child processes, read from ``/proc`` (no ``pgrep``: slim images lack
        procps)."""
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text(encoding="ascii", errors="replace")
            except OSError:  # the process ended meanwhile
                continue
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses
            fields = text.rpartition(")")[2].split()
            if len(fields) > 1 and fields[1] == str(self.process.pid):
                found.append(int(stat.parent.name))
        return sorted(found)


def start_worker(
    env: Env,
    *,
    pool: str = "prefork",
    concurrency: int = 2,
    name: str | None = None,
    extra_args: list[str] | None = None,
    wait: bool = True,
    timeout: float = 45.0,
    queues: list[str] | None = None,
) -> Worker:
    """Start a ``celery worker`` subprocess consuming ``queues`` (default: ``env.queue``)."""
    node = f"{name or pool}-{uuid.uuid4().hex[:6]}@localhost"
    logdir = Path(tempfile.mkdtemp(prefix="cs-worker-"))
    logfile = logdir / "worker.log"
    outfile = logdir / "output.txt"
    args = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        env.app_module,
        "worker",
        "-P",
        pool,
        "-c",
        str(concurrency),
        "-n",
        node,
        "-Q",
        ",".join(queues or [env.queue]),
        "--without-gossip",
        "--without-mingle",
        "-l",
        "INFO",
        "--logfile",
        str(logfile),
        *(extra_args or []),
    ]
    with outfile.open("wb") as out:
        proc = subprocess.Popen(
            args,
            env=env.environ(),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    worker = Worker(node, proc, logfile, outfile)
    if wait:
        try:
            wait_ready(env, worker, timeout)
        except BaseException:
            worker.stop(timeout=5)
            raise
    return worker


def wait_ready(env: Env, worker: Worker, timeout: float) -> None:
    app = env.client_app()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if worker.process.poll() is not None:
                raise RuntimeError(f"worker {worker.name} exited early:\n{worker.log()[-3000:]}")
            try:
                replies = app.control.ping(destination=[worker.name], timeout=0.5)
            except (OSError, OperationalError):  # the broker dropped us (RabbitMQ under load)
                time.sleep(0.2)
                continue
            if replies:
                return
        raise TimeoutError(f"worker {worker.name} not ready in {timeout}s:\n{worker.log()[-3000:]}")
    finally:
        app.close()


@contextmanager
def workers(env: Env, *specs: Mapping[str, Any]) -> Iterator[list[Worker]]:
    """Start one worker per spec (kwargs of :func:`start_worker`); stop them all on exit."""
    started: list[Worker] = []
    try:
        for spec in specs:
            started.append(start_worker(env, **spec))
        yield started
    finally:
        for w in started:
            w.stop()


def start_workers(env: Env, *specs: Mapping[str, Any], timeout: float = 45.0) -> list[Worker]:
    """Start one worker per spec (kwargs of :func:`start_worker`) at the same time, then wait
    until every one answers a ping; on any failure stop them all."""
    started: list[Worker] = []
    try:
        for spec in specs:
            started.append(start_worker(env, **{**spec, "wait": False}))
        for w in started:
            wait_ready(env, w, timeout)
    except BaseException:
        for w in started:
            w.stop(timeout=5)
        raise
    return started


def stop_workers(nodes: list[Worker], timeout: float = 20.0) -> None:
    """Warm-stop several workers at once (SIGTERM to all, then :meth:`Worker.stop` each)."""
    for node in nodes:
        with suppress(ProcessLookupError):
            node.signal(signal.SIGTERM)
    for node in nodes:
        node.stop(timeout=timeout)


def wait_until(predicate: Any, timeout: float, interval: float = 0.02, what: str = "") -> None:
    """Poll a cheap predicate until true (bounded in time); raise with ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"not reached within {timeout}s: {what}")


@contextmanager
def prefork_pair(redis_server: Any, include: str, gate: bool) -> Iterator[tuple[Env, list[Worker]]]:
    """Two prefork nodes (``-c 4``, named a and b) loading the task module ``include``, with
    the worker's gate on or off (``semaphore_worker_hold=0``: tasks wait in their slot or
    park); their keys and queue deleted afterwards."""
    extra: dict[str, object] = {"include": [include]}
    if not gate:
        extra["semaphore_worker_hold"] = 0
    env = Env(redis_url=redis_server.url(0), broker_url=redis_server.url(0), extra=extra)
    started = start_workers(
        env,
        {"pool": "prefork", "concurrency": 4, "name": "a"},
        {"pool": "prefork", "concurrency": 4, "name": "b"},
    )
    try:
        yield env, started
    finally:
        stop_workers(started)
        client = redis_server.client(0)
        delete_prefix(client, env.prefix)
        client.delete(env.queue)
