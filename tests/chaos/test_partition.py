"""Issue 31: one node cut from the semaphores' Redis, and one node stalled but alive.

Two prefork nodes, each consuming its own queue (the test decides which node runs what); only
node b reaches the semaphores' Redis (a redis-server this module starts) through a TCP proxy
the test controls (:mod:`tests.chaos.proxy`); node a reaches it directly, and the broker and
the result backend stay on the session's Redis.  Limit 2, lease 30 s, so that a permit that
comes back within seconds comes back by the liveness record (``semaphore_liveness_ttl``), not
by its lease.

* **A partition** (:func:`test_a_node_cut_from_redis`): b holds both units with long bodies,
  a's tasks wait; b is cut off for 10 s.  b's record expires about ``semaphore_liveness_ttl``
  after the cut and a's tasks take the units (a stale holder on each side of the cut: the
  documented overlap window).  Once b is back, its bodies' next refresh finds their permits
  gone and tells them (``LeaseLost`` at their next ``checkpoint()``, ``permit LOST`` in the
  log), and their releases free nobody else's unit.
* **A slow but live node** (:func:`test_a_stalled_node_is_not_reclaimed_early`): b's whole
  process group is stopped (SIGSTOP) for less than its record lives, then continued: its
  permits are never taken.

Both are checked against the independent ledger of :mod:`tests.chaos.record` and a sampler of
the semaphore's holders, never against the semaphore's own word alone.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from celery_semaphore.core import liveness
from celery_semaphore.ops.testing import RedisServer, start_redis_server
from tests.conftest import delete_prefix
from tests.integration.workers import Worker, start_worker, stop_workers, wait_ready, wait_until

from .harness import Chaos, measure, overlap
from .proxy import Proxy
from .record import Entry

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

LIMIT = 2
LEASE = 30.0
#: seconds the node is cut off
CUT = 10.0


@dataclasses.dataclass
class Pair:
    chaos: Chaos
    a: Worker
    b: Worker
    proxy: Proxy

    def send(self, node: str, n: int, mode: str, seconds: float, **kw: Any) -> list[str]:
        queue = f"{self.chaos.env.queue}-{node}"
        return [self.chaos.send(mode, seconds, queue=queue, **kw).id for _ in range(n)]

    def starts(self, ids: list[str]) -> list[Entry]:
        return [e for e in self.chaos.rec.ledger() if e.event == "start" and e.task_id in ids]

    def ends(self, ids: list[str]) -> list[Entry]:
        return [e for e in self.chaos.rec.ledger() if e.event == "end" and e.task_id in ids]


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    server = start_redis_server()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def pair(redis_server: RedisServer, own: RedisServer, **settings: object) -> Iterator[Pair]:
    """Nodes a (direct) and b (through a proxy) with ``settings`` added to the app's."""
    session = redis_server.url(0)
    proxy = Proxy(own.port)
    chaos = Chaos(
        sem_url=own.url(0),
        broker_url=session,
        backend_url=session,
        limit=LIMIT,
        lease=LEASE,
        extra={"semaphore_on_lease_lost": "raise", **settings},
    )
    env_b = dataclasses.replace(chaos.env, redis_url=proxy.url(0))
    nodes: list[Worker] = []
    try:
        for env, name in ((chaos.env, "a"), (env_b, "b")):
            queues = [f"{chaos.env.queue}-{name}"]
            nodes.append(start_worker(env, concurrency=LIMIT, name=name, queues=queues, wait=False))
        wait_ready(chaos.env, nodes[0], 60)
        wait_ready(env_b, nodes[1], 60)
        yield Pair(chaos, nodes[0], nodes[1], proxy)
    except BaseException:
        for node in nodes:
            (chaos.dir / f"{node.name}.log").write_text(node.log())
        raise
    finally:
        proxy.set_mode("pass")
        for node in nodes:
            node.signal(signal.SIGCONT)  # never leave a stopped group behind
        stop_workers(nodes)
        proxy.close()
        chaos.close()
        client = redis_server.client(0)
        delete_prefix(client, chaos.env.prefix)
        client.delete(chaos.env.queue, f"{chaos.env.queue}-a", f"{chaos.env.queue}-b")
        client.close()
        own_client = own.client(0)
        delete_prefix(own_client, chaos.env.prefix)
        own_client.close()


def test_a_node_cut_from_redis(redis_server: RedisServer, own_redis: RedisServer) -> None:
    """Cut b (which holds both units) for 10 s: a's waiting tasks take the units about the
    liveness TTL after the cut; back, b's bodies are told at their next refresh and end with
    ``LeaseLost``; their releases free none of a's units; nothing is lost."""
    ttl, beat = 1.5, 2.0
    with pair(
        redis_server,
        own_redis,
        semaphore_liveness_ttl=ttl,
        semaphore_heartbeat_interval=beat,
    ) as p:
        chaos = p.chaos
        stale = p.send("b", LIMIT, "watch", 90.0, expect=("FAILURE:LeaseLost",))
        wait_until(lambda: len(p.starts(stale)) == LIMIT, 60, what="b's bodies hold both units")
        takers = p.send("a", LIMIT, "sleep", 25.0)
        time.sleep(1.5)  # the negative check: a's tasks wait while b holds the units
        assert p.starts(takers) == [], "a's task started while b held every unit"

        fences_b = [h.fencing_token for h in chaos.semaphore().holders()]
        cut = time.time()
        p.proxy.set_mode("refuse")
        wait_until(
            lambda: len(p.starts(takers)) == LIMIT, CUT - 1.0, what="a's tasks take the units"
        )
        took = max(e.at for e in p.starts(takers)) - cut
        measure("node cut from Redis", f"its units to the other node (ttl {ttl} s)", took)
        assert took < ttl + 6.0, f"reclaimed {took:.1f} s after the cut: not by liveness"
        assert p.ends(stale) == [], "b's bodies cannot be told while cut off"
        # a downstream service that keeps the highest fencing token it saw refuses b's writes
        fences_a = [h.fencing_token for h in chaos.semaphore().holders()]
        assert len(fences_a) == len(fences_b) == LIMIT
        assert min(fences_a) > max(fences_b), (fences_a, fences_b)
        time.sleep(max(0.0, cut + CUT - time.time()))  # the rest of the cut itself
        p.proxy.set_mode("pass")
        back = time.time()

        # b's next refresh finds the permits gone; its bodies end with LeaseLost
        wait_until(lambda: len(p.ends(stale)) == LIMIT, beat + 20.0, what="b's bodies are told")
        told = max(e.at for e in p.ends(stale)) - back
        measure("node cut from Redis", "its bodies told after it is back", told)
        assert {e.extra[0] for e in p.ends(stale)} == {"LeaseLost"}
        # their releases are done once their results are in (the release is in the task)
        wait_until(lambda: all(chaos.results[t].ready() for t in stale), 30, what="b's tasks end")
        assert p.ends(takers) == [], "a's bodies ended too soon for the check below"
        holders = chaos.semaphore().holders()
        assert sorted(str(h.owner.get("task_id")) for h in holders) == sorted(takers), (
            f"after b's releases the holders are {holders}, not a's two tasks"
        )
        later = p.send("b", LIMIT, "ok", 0.5)  # must wait for a's bodies, on b too

        report = chaos.check(results_within=120)
        window, first, last, worst = overlap(report.ledger, LIMIT, set(stale))
        measure("node cut from Redis", "overlap window (ledger, > limit inside)", window)
        logs = p.b.log()
        problems = [
            x
            for x in report.problems(LIMIT)
            if not x.startswith("over the limit")  # the window, checked below
        ]
        assert not problems, f"{problems} (ledger and logs in {chaos.dir})"
        assert report.holders_gone_after >= 0, chaos.semaphore().holders()
        assert chaos.watch.max_used <= LIMIT, f"the semaphore counted {chaos.watch.max_used}"
        # outside the window never more than the limit; inside it, only b's stale bodies over
        assert worst <= LIMIT, f"{worst} bodies inside beside b's stale ones"
        assert window > 0.0, "no overlap measured: b's bodies were not inside past the reclaim"
        assert cut <= first, "more than the limit inside before the cut"
        assert last <= max(e.at for e in p.ends(stale)) + 0.001, "over after b's bodies ended"
        assert min(e.at for e in p.starts(later)) >= min(e.at for e in p.ends(takers))
        assert report.states["SUCCESS"] == 2 * LIMIT
        assert report.states["FAILURE:LeaseLost"] == LIMIT
        assert logs.count("permit LOST") >= LIMIT, "b's log does not say its permits were lost"


def test_a_stalled_node_is_not_reclaimed_early(
    redis_server: RedisServer, own_redis: RedisServer
) -> None:
    """b's whole process group stopped for 1.5 s, half its 3 s liveness TTL (a GC pause, a
    CPU-starved container), right after its record's refresh: its permits stay its own, a's
    tasks start only once b's bodies give units back, and nothing is reclaimed."""
    with pair(redis_server, own_redis, semaphore_liveness_ttl=3.0) as p:
        chaos = p.chaos
        held = p.send("b", LIMIT, "watch", 5.0)
        wait_until(lambda: len(p.starts(held)) == LIMIT, 60, what="b's bodies hold both units")
        waiting = p.send("a", LIMIT, "ok", 0.5)
        time.sleep(1.0)  # a's gate is waiting, and sweeping the name
        # stop b just after its record was refreshed (every ttl / 3): the stall alone counts,
        # not where it falls between two refreshes (a stall up to 2/3 of the ttl is safe)
        (ident,) = {h.process for h in chaos.semaphore().holders()}
        assert ident is not None
        records = own_redis.client(0)
        try:
            key = liveness.procs_key(chaos.env.prefix)
            before = records.zscore(key, ident)
            wait_until(lambda: records.zscore(key, ident) != before, 5, 0.005, "b's refresh")
        finally:
            records.close()
        p.b.signal(signal.SIGSTOP)
        try:
            time.sleep(1.5)  # the stall itself
        finally:
            p.b.signal(signal.SIGCONT)
        report = chaos.check(results_within=90)
        problems = report.problems(LIMIT)
        assert not problems, f"{problems} (ledger and logs in {chaos.dir})"
        assert report.holders_gone_after >= 0
        assert chaos.watch.max_used <= LIMIT
        assert report.states["SUCCESS"] == 2 * LIMIT
        # a unit goes to a only when one of b's bodies gives it back
        assert min(e.at for e in p.starts(waiting)) >= min(e.at for e in p.ends(held))
        assert {e.extra[0] for e in p.ends(held)} == {"ok"}
        logs = p.a.log() + p.b.log()
        assert "permit LOST" not in logs
        assert "reclaimed" not in logs
        state = own_redis.client(0)
        try:
            assert state.hget(chaos.semaphore().keys.state, "died") is None
        finally:
            state.close()
