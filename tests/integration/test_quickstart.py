"""The quickstart works as written: its files, its worker command, a real worker, the limit held.

``docs/quickstart.md``'s ``python file=...`` blocks are written out as they are, with two
changes the test needs: the Redis URL is the test Redis, and ``proj.py`` gets the test's key
prefix and queue (so it touches nothing else on a shared Redis) plus an independent count of the
bodies running at once: ``time.sleep`` in the body is counted (INCR/DECR of a key of its own,
not the semaphore's) and shortened, so the test takes seconds, not 7.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from celery_semaphore import Semaphore
from celery_semaphore.integration import standby
from tests.doc_blocks import DOC_REDIS_URL, DOCS, blocks

from .workers import ROOT, Env, Worker, wait_ready, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PAGE = DOCS / "quickstart.md"
LIMIT = 3  # the limit proj.py sets: checked below
TASKS = 20  # what send.py sends: checked below
HOLD = 0.3  # seconds the counted time.sleep(1) really sleeps
CONCURRENCY = 6  # the worker command's --concurrency: checked below
STANDBY = 2  # semaphore_worker_standby's default on prefork: checked below

HARNESS = """

# --- appended by tests/integration/test_quickstart.py ---------------------------------------
import redis as _redis
from celery import signals as _signals

app.conf.update(semaphore_key_prefix={prefix!r}, task_default_queue={queue!r})
_counter = _redis.Redis.from_url({url!r})


class _CountedTime:
    \"\"\"``time`` for the body: its sleep counts the bodies inside, independently.\"\"\"

    def __getattr__(self, name):
        return getattr(_real_time, name)

    def sleep(self, seconds):
        now = _counter.incr({inside!r})
        _counter.rpush({seen!r}, now)
        try:
            _real_time.sleep({hold!r})
        finally:
            _counter.decr({inside!r})


_real_time = time
time = _CountedTime()


@_signals.task_prerun.connect
def _in_a_slot(**_):  # the pool runs the task: its body, or its wait in the slot (standby)
    _counter.rpush({in_slots_seen!r}, _counter.incr({in_slots!r}))


@_signals.task_postrun.connect
def _out_of_its_slot(**_):
    _counter.decr({in_slots!r})
"""


def page_files() -> dict[str, str]:
    return {
        b.tags["file"]: b.source for b in blocks(PAGE) if b.lang == "python" and "file" in b.tags
    }


def worker_command() -> list[str]:
    lines = [
        line.strip()
        for b in blocks(PAGE)
        if b.lang == "console"
        for line in b.source.splitlines()
        if line.strip().startswith("celery -A proj worker")
    ]
    assert len(lines) == 1, f"expected one worker command on the page, found {lines}"
    return shlex.split(lines[0])


def test_the_page_is_what_this_test_assumes() -> None:
    files = page_files()
    assert set(files) == {"proj.py", "send.py", "watch.py"}
    assert f'@limited("payment-gateway", limit={LIMIT})' in files["proj.py"]
    assert "time.sleep(1)" in files["proj.py"]
    assert f"range({TASKS})" in files["send.py"]
    concurrency = worker_command()[worker_command().index("--concurrency") + 1]
    assert int(concurrency) == CONCURRENCY > LIMIT, "the worker must have more slots than the limit"
    assert STANDBY == standby.PREFORK_DEFAULT


def text_blocks() -> list[str]:
    return [b.source for b in blocks(PAGE) if b.lang == "text"]


def succeeded_in(log: str) -> list[float]:
    """The ``succeeded in <seconds>s`` of every task in a worker log."""
    return [float(x) for x in re.findall(r"succeeded in ([0-9.]+)s", log)]


def test_the_sample_outputs_say_what_a_run_shows() -> None:
    """The worker log's sample: bodies take their own second, a task that stood by in its
    slot (STANDBY at most at once) its wait besides, up to another body's; all 20 tasks;
    watch.py's sample: the other 17 wait in line at once."""
    log = next(t for t in text_blocks() if "succeeded in" in t)
    took = succeeded_in(log)
    assert took, "no 'succeeded in' line in the worker log sample"
    assert all(1.0 <= t < 2.5 for t in took), took  # time.sleep(1), maybe a wait for one body
    assert any(t < 1.5 for t in took), took  # handed to the pool with a permit
    assert any(t >= 1.5 for t in took), took  # stood by in a slot
    assert f"'charged customer {TASKS - 1}'" in log
    watch = next(t for t in text_blocks() if t.startswith("running "))
    waiting = [int(n) for n in re.findall(r"waiting in line (\d+)", watch)]
    assert max(waiting) == TASKS - LIMIT
    assert f"running {LIMIT}/{LIMIT}, waiting in line {TASKS - LIMIT}" in watch


def test_quickstart_holds_its_limit_with_a_real_worker(env: Env) -> None:
    inside, seen = f"{env.prefix}:inside", f"{env.prefix}:seen"
    in_slots, in_slots_seen = f"{env.prefix}:in-slots", f"{env.prefix}:in-slots-seen"
    workdir = Path(tempfile.mkdtemp(prefix="cs-quickstart-"))
    files = {name: src.replace(DOC_REDIS_URL, env.redis_url) for name, src in page_files().items()}
    files["proj.py"] += HARNESS.format(
        prefix=env.prefix,
        queue=env.queue,
        url=env.redis_url,
        inside=inside,
        seen=seen,
        hold=HOLD,
        in_slots=in_slots,
        in_slots_seen=in_slots_seen,
    )
    for name, source in files.items():
        (workdir / name).write_text(source)

    node = f"quickstart-{uuid.uuid4().hex[:6]}@localhost"
    command = worker_command()
    assert command[0] == "celery"
    args = [sys.executable, "-m", *command, "-n", node, "--without-gossip", "--without-mingle"]
    logfile, outfile = workdir / "worker.log", workdir / "output.txt"
    args += ["--logfile", str(logfile)]
    with outfile.open("wb") as out:
        proc = subprocess.Popen(
            args,
            cwd=workdir,
            env={**env.environ(), "PYTHONPATH": str(workdir) + ":" + str(ROOT)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    worker = Worker(node, proc, logfile, outfile)
    client = env.redis()
    try:
        wait_ready(env, worker, timeout=60)
        sem = Semaphore("payment-gateway", LIMIT, redis=client, key_prefix=env.prefix)
        longest_line: list[int] = [0]
        stop_watching = threading.Event()

        def watch() -> None:  # what watch.py prints, sampled more often (bounded: 90 s)
            deadline = time.monotonic() + 90
            while not stop_watching.is_set() and time.monotonic() < deadline:
                longest_line[0] = max(longest_line[0], len(sem.inspect().waiters))
                stop_watching.wait(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        subprocess.run(
            [sys.executable, "send.py"],
            cwd=workdir,
            env={**env.environ(), "PYTHONPATH": str(workdir)},
            check=True,
            timeout=60,
        )
        wait_until(
            lambda: client.llen(seen) >= TASKS and int(client.get(inside) or 0) == 0,
            timeout=90,
            what=f"{TASKS} bodies done\n{worker.log()[-3000:]}",
        )
        stop_watching.set()
        watcher.join(10)
        counts = [int(x) for x in client.lrange(seen, 0, -1)]
        assert len(counts) == TASKS
        assert max(counts) == LIMIT, f"bodies at once: {counts}"
        # as the samples say: the tasks wait in line (held by the worker; the first ones may
        # already run while the last arrive)
        assert longest_line[0] >= TASKS - 2 * LIMIT, longest_line
        # and off the pool: besides the bodies, at most STANDBY tasks wait in a slot (counted
        # by Celery's own prerun/postrun signals, not by the semaphore), so a slot stays free
        wait_until(lambda: int(client.get(in_slots) or 0) == 0, 10, what="the slots emptied")
        slots_used = [int(x) for x in client.lrange(in_slots_seen, 0, -1)]
        assert len(slots_used) >= TASKS, slots_used  # more if a standby parked and came back
        assert max(slots_used) <= LIMIT + STANDBY < CONCURRENCY, slots_used
        # a body's end is counted before its worker logs "succeeded": wait for the last line
        wait_until(
            lambda: len(succeeded_in(worker.log())) >= TASKS,
            timeout=10,
            what=f"{TASKS} 'succeeded' lines\n{worker.log()[-3000:]}",
        )
        assert len(succeeded_in(worker.log())) == TASKS, worker.log()[-3000:]
        wait_until(lambda: sem.inspect().used == 0, timeout=10, what="permits given back")
        assert sem.holders() == []
    finally:
        worker.stop()
        client.close()
