"""Where a limited task's worker CPU and Redis commands go (issue 18, item 3).

    python benchmarks/e2e_profile.py [--pool prefork|threads|both] [--n 400] [--d 0.02]
                                     [--top 25] [--keep]

On a throwaway ``redis-server`` of its own (so ``INFO commandstats`` counts this run's commands
only; it is also the broker), for each pool it runs the nodes of ``benchmarks/e2e.py``'s (b)
(2 nodes, spare slots) once per case: ``off`` (the same task with ``semaphore_enabled=False``:
plain bodies on the same nodes), ``b`` (``@limited(limit=8)``, the ``celery_semaphore``
loggers at INFO, as in e2e.py), ``b-quiet`` (the same at WARNING) and, with ``--cases``,
``b-free`` (a limit of 10000: every task is granted on arrival).  Every thread of every
worker process runs under cProfile with a per-thread CPU clock (``time.thread_time``), so the
profiles show CPU, not waiting; the profiler's own overhead inflates every figure (compare
cases, not absolute values).  The profiles and the command counts cover the measured part of
the run only (after the warm-up, until every body was recorded).

Prints, per pool: worker CPU ms per task by process (main: consumer, hub, gate; children:
prefork pool processes) measured from /proc without the profiler's share removed, and of it
the share of threads other than each process's first (the gate's threads, heartbeats); Redis
commands per task by command; and the functions whose CPU grew most from ``off`` to ``b``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import os
import pstats
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import e2e  # benchmarks/e2e.py: this script's directory is sys.path[0]
import e2e_app
import redis

from celery_semaphore.core import _scripts
from celery_semaphore.ops.testing import start_redis_server

#: seconds the workers are watched idle before the measured run
IDLE = 3.0
#: (name, e2e design, level of the celery_semaphore loggers, limit)
CASES = (
    ("off", "off", "INFO", 8),
    ("b", "b", "INFO", 8),
    ("b-quiet", "b", "WARNING", 8),
    # (b) without standby (semaphore_worker_standby=0): what standby costs and saves
    ("b0", "b0", "INFO", 8),
    # the limit above the tasks in flight: every task is granted on arrival (no wait, no
    # wake-up, no handoff), so b - b-free is what waiting costs
    ("b-free", "b", "INFO", 10_000),
)


def role_cpu(workers: list[e2e.Worker]) -> dict[str, float]:
    """CPU seconds (user + system) by role: the workers' leaders ("main") and every other
    process of their groups ("child"); and "switches": context switches (voluntary and not)
    of every thread of them."""
    leaders = {w.process.pid for w in workers}
    tick = os.sysconf("SC_CLK_TCK")
    out = {"main": 0.0, "child": 0.0, "switches": 0.0, "main_bg": 0.0, "child_bg": 0.0}
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) in leaders:
            role = "main" if int(pid) in leaders else "child"
            out[role] += (int(fields[11]) + int(fields[12])) / tick
            out[role + "_bg"] += _background_cpu(pid) / tick
            out["switches"] += _switches(pid)
    return out


def _background_cpu(pid: str) -> int:
    """Clock ticks of the threads of ``pid`` other than its first (ours, Redis clients')."""
    total = 0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            if tid == pid:
                continue
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
    return total


def _switches(pid: str) -> int:
    total = 0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if "ctxt_switches:" in line:
                        total += int(line.split()[-1])
    return total


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) one process used so far (NaN when unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def touch(path: Path) -> None:
    path.write_text(str(time.time_ns()))
    os.utime(path, ns=(time.time_ns(), time.time_ns()))


def count_scripts(url: str, stop: threading.Event, out: Counter[str]) -> None:
    """Count EVALSHA calls by script (MONITOR) until ``stop`` is set."""
    names = {
        hashlib.sha1(_scripts.source(op).encode()).hexdigest(): op for op in _scripts.OPERATIONS
    }
    r = redis.Redis.from_url(url)
    try:
        with r.monitor() as monitor:  # type: ignore[no-untyped-call]
            for command in monitor.listen():
                if stop.is_set():
                    break
                words = str(command.get("command", "")).split()
                if words and words[0].upper() == "EVALSHA" and len(words) > 1:
                    out[names.get(words[1], words[1][:8])] += 1
                elif words:
                    out["(" + words[0].upper() + ")"] += 1
    finally:
        r.close()


def run_case(
    url: str,
    pool: str,
    case: str,
    design_key: str,
    level: str,
    limit: int,
    load: e2e.Load,
    root: Path,
    *,
    profile: bool,
    monitor: bool,
    server_pid: int,
) -> dict[str, Any]:
    design = e2e.designs(pool)[design_key]
    profdir = root / f"{pool}-{case}"
    (profdir / "logs").mkdir(parents=True)
    if profile:
        os.environ["E2E_PROFILE"] = str(profdir)
    else:
        os.environ.pop("E2E_PROFILE", None)
    os.environ["E2E_SEM_LOG"] = level
    prefix = f"bench-prof-{uuid.uuid4().hex[:10]}"
    cfg = e2e_app.AppConfig(
        redis_url=url,
        prefix=prefix,
        queue=f"{prefix}:q",
        limit=limit,
        conf=dict(design.conf),
    )
    client = e2e_app.make_app(cfg, "e2e-profile-client")
    r = redis.Redis.from_url(url)
    workers: list[e2e.Worker] = []
    try:
        workers = e2e.start_workers(cfg, client, pool, design.nodes, design.slots, profdir / "logs")
        warm = e2e.Load(2 * design.nodes * design.slots, 0.005)
        e2e._send(client, e2e_app.PLAIN, warm)
        # as many limited ones: every pool process takes its first limited task here (its
        # semaphore, scripts and connection are made then), not in the measured run
        warm_limited = e2e.Load(warm.n, 0.001)
        e2e._send(client, design.task, warm_limited)
        if not e2e._wait_ledgers(r, cfg, {"plain": warm.n, design.kind: warm_limited.n}, 60.0):
            raise RuntimeError(f"{pool}/{case}: warm-up did not finish in 60 s")
        time.sleep(0.3)
        e2e._reset_bookkeeping(r, cfg)
        touch(profdir / "reset")
        time.sleep(0.3)  # every process's control thread polls every 50 ms
        # idle: the same workers with nothing to do, for IDLE seconds
        r.config_resetstat()
        idle0 = role_cpu(workers)
        time.sleep(IDLE)
        idle1 = role_cpu(workers)
        idle_stats = r.info("commandstats")
        scripts: Counter[str] = Counter()
        stop = threading.Event()
        watcher = None
        if monitor:
            watcher = threading.Thread(target=count_scripts, args=(url, stop, scripts), daemon=True)
            watcher.start()
            time.sleep(0.3)
        r.config_resetstat()
        cpu0 = role_cpu(workers)
        server0 = process_cpu(server_pid)
        t0 = time.monotonic()
        e2e._send(client, design.task, load)
        done = e2e._wait_ledgers(r, cfg, {design.kind: load.n}, 120.0)
        elapsed = time.monotonic() - t0
        stats = r.info("commandstats")
        cpu1 = role_cpu(workers)
        server1 = process_cpu(server_pid)
        stop.set()
        if watcher is not None:
            r.ping()  # one more command, so that MONITOR's reader sees the stop
            watcher.join(timeout=10)
        processes = len(
            [
                p
                for p in os.listdir("/proc")
                if p.isdigit() and _pgrp(p) in {w.process.pid for w in workers}
            ]
        )
        touch(profdir / "dump")
        deadline = time.monotonic() + (20 if profile else 0)
        while time.monotonic() < deadline:
            if len(list(profdir.glob("*.prof"))) >= processes:
                break
            time.sleep(0.1)
        time.sleep(0.5)
        logs = [w.log() for w in workers]
    finally:
        for worker in workers:
            worker.stop()
        with contextlib.suppress(Exception), client.connection_for_write() as conn:
            conn.default_channel.queue_delete(cfg.queue)
        client.close()
        e2e.cleanup(r, prefix)
        r.close()
    commands = {
        name.removeprefix("cmdstat_"): int(v["calls"])
        for name, v in stats.items()
        if isinstance(v, dict) and "calls" in v
    }
    profiles: dict[str, pstats.Stats | None] = {"main": None, "child": None}
    for path in sorted(profdir.glob("*.prof")):
        role = path.stem.split("-", 1)[1]
        if profiles[role] is None:
            profiles[role] = pstats.Stats(str(path))
        else:
            profiles[role].add(str(path))  # type: ignore[union-attr]
    lines = sum(text.count("\n") for text in logs)
    return {
        "done": done,
        "elapsed": elapsed,
        "cpu": {k: cpu1[k] - cpu0[k] for k in cpu0},
        "commands": commands,
        "profiles": profiles,
        "log_lines": lines,
        "idle_cpu": {k: (idle1[k] - idle0[k]) / IDLE for k in idle0},
        "idle_commands": sum(
            int(v["calls"]) for v in idle_stats.values() if isinstance(v, dict) and "calls" in v
        )
        / IDLE,
        "label": " (under the profiler)" if profile else "",
        "server_cpu": server1 - server0,
        "waits_logged": sum(text.count(" waits (limit") for text in logs),
        "scripts": scripts,
        "n": load.n,
    }


def _pgrp(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[2])
    except (OSError, ValueError, IndexError):
        return -1


def by_function(stats: pstats.Stats | None) -> dict[str, tuple[float, float, int]]:
    """{function: (tottime s, cumtime s, calls)}."""
    if stats is None:
        return {}
    out: dict[str, tuple[float, float, int]] = {}
    for (file, line, name), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        short = file
        for marker in ("site-packages/", "lib/python3", "/work/wt/bench/"):
            if marker in file:
                short = file.split(marker, 1)[1]
        key = f"{short}:{line}({name})"
        tot, cum, calls = out.get(key, (0.0, 0.0, 0))
        out[key] = (tot + tt, cum + ct, calls + nc)
    return out


def report(pool: str, results: dict[str, dict[str, Any]], top: int) -> None:
    print(f"== pool {pool} ==")
    for case, res in results.items():
        n = res["n"]
        cpu = res["cpu"]
        print(
            f"  {case:8s}: {n} tasks, {'complete' if res['done'] else 'INCOMPLETE'} in "
            f"{res['elapsed']:.2f} s; worker CPU ms/task{res['label']}: main "
            f"{cpu['main'] * 1000 / n:.2f}, children {cpu['child'] * 1000 / n:.2f}, total "
            f"{(cpu['main'] + cpu['child']) * 1000 / n:.2f} (in threads other than the "
            f"first: main {cpu['main_bg'] * 1000 / n:.2f}, children "
            f"{cpu['child_bg'] * 1000 / n:.2f}); worker log lines "
            f"{res['log_lines']}, of them 'waits (limit' INFO lines {res['waits_logged']}"
        )
        idle = res["idle_cpu"]
        print(
            f"    idle, before the run: worker CPU ms/s main {idle['main'] * 1000:.1f}, children "
            f"{idle['child'] * 1000:.1f}; Redis commands/s {res['idle_commands']:.0f}"
        )
        print(
            f"    redis-server CPU ms/task: {res['server_cpu'] * 1000 / n:.2f}; worker context "
            f"switches per task (all threads): {cpu['switches'] / n:.1f}"
        )
        if res["scripts"]:
            print(
                "    MONITOR, EVALSHA per task by script: "
                + ", ".join(
                    f"{k} {v / n:.2f}"
                    for k, v in res["scripts"].most_common()
                    if not k.startswith("(")
                )
            )
    names = sorted({c for res in results.values() for c in res["commands"]})
    print("  Redis commands per task (INFO commandstats deltas; commands run by scripts count")
    print("  under their own names as well as under EVAL/EVALSHA):")
    print("    " + f"{'command':24s}" + "".join(f"{case:>10s}" for case in results))
    rows = []
    for name in names:
        per = [res["commands"].get(name, 0) / res["n"] for res in results.values()]
        rows.append((name, per))
    rows.sort(key=lambda row: -max(row[1]))
    for name, per in rows:
        if max(per) >= 0.005:
            print("    " + f"{name:24s}" + "".join(f"{v:10.2f}" for v in per))
    totals = [sum(res["commands"].values()) / res["n"] for res in results.values()]
    print("    " + f"{'all':24s}" + "".join(f"{v:10.2f}" for v in totals))
    base, limited = results.get("off"), results.get("b")
    if base is None or limited is None:
        return
    for role in ("main", "child"):
        b_funcs = by_function(limited["profiles"][role])
        o_funcs = by_function(base["profiles"][role])
        if not b_funcs:
            continue
        # the frames on a thread's stack at the dump are flushed with the dumping thread's
        # clock (garbage, often negative): leave out negative own times
        total_b = sum(max(0.0, v[0]) for v in b_funcs.values())
        total_o = sum(max(0.0, v[0]) for v in o_funcs.values())
        n = limited["n"]
        print(
            f"  {role}: profiled CPU ms/task: b {total_b * 1000 / n:.2f}, off "
            f"{total_o * 1000 / base['n']:.2f}"
        )
        print(f"  {role}: top {top} functions by own CPU (tottime) growth from off to b, ms/task:")
        deltas = []
        for key, (tt, ct, calls) in b_funcs.items():
            otot, _, ocalls = o_funcs.get(key, (0.0, 0.0, 0))
            deltas.append((tt / n - otot / base["n"], ct / n, calls / n, ocalls / base["n"], key))
        deltas.sort(reverse=True)
        for dt, cum, calls, ocalls, key in deltas[:top]:
            print(
                f"    {dt * 1000:7.3f}  cum {cum * 1000:7.3f}  calls {calls:6.1f} "
                f"(off {ocalls:5.1f})  {key}"
            )
        print(f"  {role}: top {top} celery_semaphore functions by cumulative CPU in b, ms/task:")
        ours = [
            (ct / n, tt / n, calls / n, key)
            for key, (tt, ct, calls) in b_funcs.items()
            if key.startswith("celery_semaphore") or "/celery_semaphore/" in key
        ]
        ours.sort(reverse=True)
        for cum, tt, calls, key in ours[:top]:
            print(f"    cum {cum * 1000:7.3f}  own {tt * 1000:7.3f}  calls {calls:6.2f}  {key}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pool", choices=("threads", "prefork", "both"), default="prefork")
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--d", type=float, default=0.02)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--cases", default="off,b,b-quiet", help="of: off,b,b-quiet,b0,b-free")
    parser.add_argument("--keep", action="store_true", help="keep the profiles and logs")
    parser.add_argument("--no-profile", action="store_true", help="CPU and commands only")
    parser.add_argument(
        "--monitor", action="store_true", help="count EVALSHA by script with MONITOR (slower)"
    )
    args = parser.parse_args(argv)
    pools = ["threads", "prefork"] if args.pool == "both" else [args.pool]
    wanted = set(args.cases.split(","))
    root = Path(tempfile.mkdtemp(prefix="cs-e2e-profile-"))
    server = start_redis_server()
    try:
        url = server.url(db=0)
        for pool in pools:
            results: dict[str, dict[str, Any]] = {}
            for case, key, level, limit in CASES:
                if case in wanted:
                    t0 = time.monotonic()
                    results[case] = run_case(
                        url,
                        pool,
                        case,
                        key,
                        level,
                        limit,
                        e2e.Load(args.n, args.d),
                        root,
                        profile=not args.no_profile,
                        monitor=args.monitor,
                        server_pid=server.process.pid if server.process else -1,
                    )
                    print(
                        f"  {pool}/{case}: {time.monotonic() - t0:.1f} s",
                        file=sys.stderr,
                        flush=True,
                    )
            report(pool, results, args.top)
    finally:
        server.stop()
    if args.keep:
        print(f"profiles and logs kept in {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
