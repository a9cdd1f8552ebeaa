"""The chaos tests' harness: send limited tasks under load, then check the promise.

The promise: never more than ``limit`` bodies at once, no lost task, no leaked permit, whatever
fails.  :meth:`Chaos.check` checks it against records the semaphore does not keep itself:

* the independent counter and ledger of :mod:`tests.chaos.record` (files, no Redis);
* every sent task's final state in the result backend, against what the test expects of it
  (``SUCCESS``, or a failure with a documented exception such as ``WorkerLostError``);
* a sampler of the semaphore's holders: the task ids held twice at once;
* ``holders == []`` within a bound (the lease, or less when a release path applies).

Measured recovery times are recorded with :func:`measure` and printed at the end of the run
(the table in docs/guarantees.md is taken from them).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import uuid
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery import Celery
from celery.result import AsyncResult

from celery_semaphore import HolderInfo, Semaphore

from .record import Counts, Entry, Recorder

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from tests.integration.workers import Worker

__all__ = ["MEASURED", "Chaos", "Report", "measure", "overlap"]

#: (scenario, what, seconds), in the order measured; printed by conftest at the end
MEASURED: list[tuple[str, str, float]] = []
#: where measurements are also appended (JSON lines), for the docs
MEASURE_FILE = os.environ.get("CHAOS_MEASURE_FILE", "")

TASK = "tests.chaos.tasks.step"
LATE_TASK = "tests.chaos.tasks.late_step"


def measure(scenario: str, what: str, seconds: float) -> float:
    MEASURED.append((scenario, what, seconds))
    if MEASURE_FILE:
        with open(MEASURE_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps({"scenario": scenario, "what": what, "seconds": seconds}) + "\n")
    return seconds


def _intervals(ledger: Sequence[Entry]) -> list[tuple[float, float, tuple[str, int, int]]]:
    """Each body as (start, end, key) from the ledger; one without an end is still inside."""
    opened: dict[tuple[str, int, int], float] = {}
    out = []
    for e in sorted(ledger, key=lambda e: e.at):
        key = (e.task_id, e.attempt, e.pid)
        if e.event == "start":
            opened[key] = e.at
        elif key in opened:
            out.append((opened.pop(key), e.at, key))
    out.extend((at, float("inf"), key) for key, at in opened.items())
    return out


def overlap(
    ledger: Sequence[Entry], limit: int, stale: set[str]
) -> tuple[float, float, float, int]:
    """From the ledger alone: (seconds with more than ``limit`` bodies inside, the first and
    the last instant of that, and the most bodies inside at once *not counting* those of the
    ``stale`` task ids).  A partition's overlap window: ``stale`` are the cut node's bodies."""
    points = []
    for start, end, key in _intervals(ledger):
        points.append((start, 1, key))
        points.append((end, -1, key))
    points.sort(key=lambda p: (p[0], p[1]))  # an end before a start at the same instant
    inside: set[tuple[str, int, int]] = set()
    over, first, last, worst = 0.0, float("inf"), 0.0, 0
    for i, (at, step, key) in enumerate(points):
        if step > 0:
            inside.add(key)
        else:
            inside.discard(key)
        worst = max(worst, sum(1 for k in inside if k[0] not in stale))
        if len(inside) > limit and i + 1 < len(points):
            over += points[i + 1][0] - at
            first, last = min(first, at), max(last, points[i + 1][0])
    return over, first, last, worst


@dataclass
class Report:
    counts: Counts
    states: Counter[str]
    unexpected: dict[str, str]
    lost: list[str]
    duplicates: list[str]
    doubly_held: list[str]
    holders_gone_after: float
    ledger: list[Entry] = field(repr=False, default_factory=list)

    def problems(self, limit: int) -> list[str]:
        out = []
        if self.counts.max > limit or self.counts.over:
            out.append(f"over the limit: max {self.counts.max} > {limit} ({self.counts.over}x)")
        if self.counts.double:
            out.append(f"a task body ran twice at once ({self.counts.double}x)")
        if self.counts.inside:
            out.append(f"{self.counts.inside} bodies still inside")
        if self.unexpected:
            out.append(f"unexpected final states: {dict(list(self.unexpected.items())[:5])}")
        if self.lost:
            out.append(f"lost (never finished): {len(self.lost)}: {self.lost[:5]}")
        if self.duplicates:
            out.append(f"completed more than once: {self.duplicates[:5]}")
        if self.doubly_held:
            out.append(f"held twice at once: {self.doubly_held[:5]}")
        return out


class HolderWatch:
    """Samples the semaphore's holders in a thread: task ids held twice at once, every task id
    seen holding, and the most units the semaphore itself counted as held."""

    def __init__(self, sem: Semaphore, interval: float = 0.05) -> None:
        self.sem, self.interval = sem, interval
        self.doubly_held: set[str] = set()
        self.ever_held: set[str] = set()
        self.max_used = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="holder-watch")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                hs: list[HolderInfo] = self.sem.holders()
            except Exception:  # Redis may be down on purpose; sampled again later
                self.errors += 1
            else:
                self.max_used = max(self.max_used, sum(h.weight for h in hs))
                seen = Counter(str(h.owner.get("task_id")) for h in hs)
                self.doubly_held.update(t for t, n in seen.items() if n > 1)
                self.ever_held.update(seen)
            self._stop.wait(self.interval)


@dataclass
class Settled:
    """When waiting longer for results can change nothing a test asserts: every task still
    without a result is one ``allowed()`` lets be lost (e.g. one that held a permit on a node
    killed since: Celery's at-most-once for early acks), and that has stayed so for ``quiet``
    seconds (long enough for a message the broker restores to be delivered and run)."""

    allowed: Callable[[], set[str]]
    quiet: float
    _since: float | None = None

    def settled(self, pending: set[str]) -> bool:
        if not pending <= self.allowed():
            self._since = None
            return False
        now = time.monotonic()
        if self._since is None:
            self._since = now
        return now - self._since >= self.quiet


class Chaos:
    """One scenario's tasks, bookkeeping and checks."""

    def __init__(
        self,
        *,
        sem_url: str,
        broker_url: str,
        backend_url: str,
        limit: int,
        lease: float,
        extra: dict[str, Any] | None = None,
    ) -> None:
        from tests.integration.workers import Env

        self.dir = Path(tempfile.mkdtemp(prefix="cs-chaos-"))
        self.limit, self.lease = limit, lease
        self.backend_url = backend_url
        self.env = Env(
            redis_url=sem_url,
            broker_url=broker_url,
            limit=limit,
            lease=lease,
            extra={"result_backend": backend_url, **(extra or {})},
            app_module="tests.chaos.tasks",
            more_env={"CS_CHAOS_DIR": str(self.dir)},
        )
        self.rec = Recorder(self.dir, limit)
        self.expect: dict[str, set[str]] = {}
        self.results: dict[str, AsyncResult] = {}
        self._app: Celery | None = None
        self.watch = HolderWatch(self.semaphore())
        self.watch.start()

    @property
    def app(self) -> Celery:
        if self._app is None:
            self._app = self.env.client_app()
        return self._app

    def semaphore(self, url: str | None = None) -> Semaphore:
        return Semaphore(
            "main", self.limit, redis=url or self.env.redis_url, key_prefix=self.env.prefix
        )

    def send(
        self,
        mode: str = "ok",
        seconds: float = 0.1,
        *,
        expect: tuple[str, ...] = ("SUCCESS",),
        late: bool = False,
        **options: Any,
    ) -> AsyncResult:
        """Send one task; ``expect``: the final states accepted, ``SUCCESS`` or
        ``FAILURE:<exception class>`` or ``REVOKED``."""
        tag = f"{mode}-{uuid.uuid4().hex[:6]}"
        task_id = str(uuid.uuid4())
        result: AsyncResult = self.app.send_task(
            LATE_TASK if late else TASK, (tag, seconds, mode), task_id=task_id, **options
        )
        self.expect[task_id] = set(expect)
        self.results[task_id] = result
        return result

    def load(self, n: int, seconds: float = 0.2, **kw: Any) -> list[AsyncResult]:
        return [self.send("ok", seconds, **kw) for _ in range(n)]

    def counts(self) -> Counts:
        return self.rec.read()

    def running(self) -> list[Entry]:
        """Ledger starts without an end (bodies inside now, or killed)."""
        ended = {(e.task_id, e.attempt, e.pid) for e in self.rec.ledger() if e.event == "end"}
        return [
            e
            for e in self.rec.ledger()
            if e.event == "start" and (e.task_id, e.attempt, e.pid) not in ended
        ]

    def held_by(self, task_id: str) -> bool:
        return any(h.owner.get("task_id") == task_id for h in self.semaphore().holders())

    def check(
        self,
        *,
        results_within: float = 90.0,
        holders_within: float | None = None,
        may_be_lost: Settled | None = None,
    ) -> Report:
        """Wait for every sent task's result, then for ``holders == []`` (within
        ``holders_within``, default the lease), and report.  ``may_be_lost``: stop waiting
        for results sooner once only tasks it allows to be lost are left (see
        :class:`Settled`); the others are always waited for, up to ``results_within``."""
        deadline = time.monotonic() + results_within
        pending = dict(self.results)
        while pending and time.monotonic() < deadline:
            for tid, r in list(pending.items()):
                if r.ready():
                    del pending[tid]
            if may_be_lost is not None and may_be_lost.settled(set(pending)):
                break
            if pending:
                time.sleep(0.1)
        states: Counter[str] = Counter()
        unexpected: dict[str, str] = {}
        final: dict[str, str] = {}
        for tid, r in self.results.items():
            if tid in pending:
                continue
            state = str(r.state)
            if state == "FAILURE":
                state = f"FAILURE:{type(r.result).__name__}"
            final[tid] = state
            states[state] += 1
            if state not in self.expect[tid]:
                unexpected[tid] = state
        started = time.monotonic()
        bound = self.lease + 2.0 if holders_within is None else holders_within
        gone_after = -1.0
        sem = self.semaphore()
        while time.monotonic() - started < bound:
            if not sem.holders():
                gone_after = time.monotonic() - started
                break
            time.sleep(0.05)
        self.watch.stop()
        ledger = self.rec.ledger()
        done = Counter(
            e.task_id
            for e in ledger
            if e.event == "end" and e.extra and e.extra[0] in ("ok", "soft")
        )
        duplicates = [t for t, n in done.items() if n > 1]
        return Report(
            counts=self.rec.read(),
            states=states,
            unexpected=unexpected,
            lost=sorted(pending),
            duplicates=duplicates,
            doubly_held=sorted(self.watch.doubly_held),
            holders_gone_after=gone_after,
            ledger=ledger,
        )

    def assert_promise(self, nodes: Sequence[Worker] = (), **kw: Any) -> Report:
        """:meth:`check`, and fail on any problem; the workers' logs are then copied next to
        the ledger (the message names the directory)."""
        report = self.check(**kw)
        problems = report.problems(self.limit)
        if report.holders_gone_after < 0:
            problems.append(f"holders left: {self.semaphore().holders()}")
        if self.watch.max_used > self.limit:
            problems.append(f"the semaphore counted {self.watch.max_used} units held")
        if problems:
            for node in nodes:
                (self.dir / f"{node.name}.log").write_text(node.log())
        assert not problems, (
            "; ".join(problems) + f" (states {dict(report.states)}; ledger and logs in {self.dir})"
        )
        return report

    def reset(self) -> None:
        """Forget the sent tasks and the bookkeeping (between tests sharing workers); call
        only when no body is inside."""
        self.forget_results()
        self.expect.clear()
        self.results.clear()
        for name in ("ledger.log", "inside.json"):
            (self.dir / name).unlink(missing_ok=True)
        self.watch.stop()
        self.watch = HolderWatch(self.semaphore())
        self.watch.start()

    def forget_results(self) -> None:
        for r in self.results.values():
            with suppress(Exception):  # cleanup only
                r.forget()

    def close(self) -> None:
        self.watch.stop()
        self.forget_results()
        if self._app is not None:
            self._app.close()
