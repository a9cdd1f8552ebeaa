"""Random operation sequences against a plain-Python model of the semaphore.

The model: a limit (the Semaphore's, or a runtime override), holders (ticket -> weight, fencing
token, partition), waiters in arrival order (ticket, weight, partition; one FIFO line per
partition), and partition records (cap, weight; the last acquirer's, kept while the partition
has holders or waiters).  Free units are handed out as docs/concepts.md "Fair sharing" says:
to the partition with waiters that holds the fewest units per unit of partition weight (ties:
the oldest head), its head first; strictly FIFO within a partition; a head heavier than the
limit or its cap is skipped; a partition at its cap is passed over; a head that does not fit
either reserves the free units (aged) or is passed over (not yet aged).  The machine runs
once with ``aging=0`` (every head is aged) and once with an aging that never passes.  Lease
and place expiry are injected deterministically by setting a score in Redis to 0, which the
next operation reclaims.  A third run makes every waiter take handoffs (its wake data ends with
``HANDOFF_MARK``, its claim in its owner): then a release grants the units it frees to the
waiters entitled to them, in the order the rule serves them, and the model does the same.
Throttles through a permit's fencing token (docs/concepts.md "Adaptive limits", without a
pause: that is timed) halve the units that may be held once per congestion episode, and every
release of a permit granted after the decrease raises them again.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from celery_semaphore import AttemptStatus, Semaphore
from celery_semaphore.core.semaphore import HANDOFF_MARK

LIMIT = 4
TICKETS = st.sampled_from([f"t{i}" for i in range(6)])
WEIGHTS = st.integers(min_value=1, max_value=LIMIT)
PARTITIONS = st.sampled_from(["", "", "a", "b"])  # the default one, twice as often
CAPS = st.sampled_from([None, None, 1, 2, 3])
PART_WEIGHTS = st.sampled_from([1, 1, 2, 3])
LONG = 60.0  # leases, places and tombstones never run out on their own during an example
PARKED = "parked"  # wake data: wake-ups come to on_wake, where the machine records them
HANDOFF = "@gate" + HANDOFF_MARK  # wake data of waiters that take handoffs
CLAIM = "the-claim"  # their claim, named in their owner


@dataclass
class Waiter:
    ticket: str
    weight: int
    partition: str


@dataclass
class Part:
    """One partition while the model works out who is entitled."""

    line: list[Waiter]
    used: int
    cap: int | None
    weight: int
    at: int = 0
    done: bool = False


@dataclass
class Model:
    aged: bool  # aging=0: every head has waited long enough to reserve the free units
    limit: int = LIMIT
    override: int | None = None
    # ticket -> weight, fence, partition
    holders: dict[str, tuple[int, int, str]] = field(default_factory=dict)
    waiters: list[Waiter] = field(default_factory=list)  # in arrival order
    records: dict[str, tuple[int | None, int]] = field(default_factory=dict)  # cap, weight
    released: set[str] = field(default_factory=set)  # tombstones
    named: set[str] = field(default_factory=set)  # waiters named in a wake-up since they queued
    fence: int = 0
    # the adaptive limit: lowered limit (0: not lowered), successes counted toward +1, and the
    # grant counter at the last decrease
    cwnd: int = 0
    acc: int = 0
    dec_fence: int = 0

    @property
    def effective(self) -> int:
        return self.override if self.override is not None else self.limit

    @property
    def cap_now(self) -> int:
        """The units that may be held now: the adaptive limit when it is lower."""
        return self.cwnd if 0 < self.cwnd < self.effective else self.effective

    def throttle(self, fence: int, decreased: bool) -> bool:
        """A throttle through a permit with this fencing token; ``decreased``: what the
        semaphore did, accepted where the rule leaves it to time (a limit that is not lowered
        forgets its last decrease once the episode's time has passed).  Returns whether the
        model lowered the limit."""
        if fence <= self.dec_fence and (self.cwnd > 0 or not decreased):
            return False
        self.cwnd = max(1, self.cap_now // 2)
        if self.cwnd >= self.effective:
            self.cwnd = 0
        self.acc = 0
        self.dec_fence = self.fence
        return True

    def succeeded(self, weight: int, fence: int) -> None:
        if self.cwnd == 0 or fence <= self.dec_fence:
            return
        self.acc += weight
        while self.acc >= self.cwnd and self.cwnd < self.effective:
            self.acc -= self.cwnd
            self.cwnd += 1
        if self.cwnd >= self.effective:
            self.cwnd = self.acc = 0

    @property
    def used(self) -> int:
        return sum(w for w, _, _ in self.holders.values())

    def part_used(self, partition: str) -> int:
        return sum(w for w, _, p in self.holders.values() if p == partition)

    def active(self) -> set[str]:
        return {p for _, _, p in self.holders.values()} | {w.partition for w in self.waiters}

    def tidy(self) -> None:
        """Records live only while their partition has holders or waiters."""
        active = self.active()
        for name in list(self.records):
            if name not in active:
                del self.records[name]

    def entitled(self) -> list[str]:
        limit = self.effective
        free = self.cap_now - self.used
        # a head heavier than the adaptive limit may start alone, when nothing is held
        alone = self.used == 0 and free < limit
        out: list[str] = []
        if not self.waiters or free <= 0:
            return out
        parts: dict[str, Part] = {}
        for w in self.waiters:
            if w.partition not in parts:
                cap, weight = self.records.get(w.partition, (None, 1))
                parts[w.partition] = Part([], self.part_used(w.partition), cap, weight)
            parts[w.partition].line.append(w)
        seq = {w.ticket: i for i, w in enumerate(self.waiters)}

        def fits(p: Part, head: Waiter) -> bool:
            return (head.weight <= free or alone) and (
                p.cap is None or p.used + head.weight <= p.cap
            )

        def never_fits(p: Part, head: Waiter) -> bool:
            return head.weight > limit or (p.cap is not None and head.weight > p.cap)

        # waiters named in a wake-up (within their grace, which outlasts an example) keep the
        # units they were named for; partitions in the order of the line's members
        for name in sorted(parts, key=lambda n: (len(n.encode()), n.encode())):
            p = parts[name]
            while free > 0 and p.at < len(p.line):
                head = p.line[p.at]
                if never_fits(p, head):
                    p.at += 1
                elif head.ticket in self.named and fits(p, head):
                    out.append(head.ticket)
                    alone = False
                    free -= head.weight
                    p.used += head.weight
                    p.at += 1
                else:
                    break
        while free > 0:
            best: Part | None = None
            for p in parts.values():
                if p.done or p.at >= len(p.line):
                    continue
                if best is None:
                    best = p
                    continue
                x, y = p.used * best.weight, best.used * p.weight
                if x < y or (x == y and seq[p.line[p.at].ticket] < seq[best.line[best.at].ticket]):
                    best = p
            if best is None:
                break
            head = best.line[best.at]
            if head.weight > limit or (best.cap is not None and head.weight > best.cap):
                best.at += 1  # can never fit
            elif best.cap is not None and best.used + head.weight > best.cap:
                best.done = True
            elif head.weight > free and not alone:
                if self.aged:
                    break  # the free units are reserved for this head
                best.done = True
            else:
                out.append(head.ticket)
                alone = False
                free -= head.weight
                best.used += head.weight
                best.at += 1
        return out

    def find(self, ticket: str) -> Waiter | None:
        return next((w for w in self.waiters if w.ticket == ticket), None)

    def position(self, ticket: str) -> int | None:
        me = self.find(ticket)
        if me is None:
            return None
        mine = [w.ticket for w in self.waiters if w.partition == me.partition]
        return mine.index(ticket)

    def drop_waiter(self, ticket: str) -> bool:
        me = self.find(ticket)
        if me is None:
            return False
        self.waiters.remove(me)
        self.named.discard(ticket)
        self.tidy()
        return True

    def acquire(
        self,
        ticket: str,
        weight: int,
        queue: bool,
        partition: str = "",
        cap: int | None = None,
        part_weight: int = 1,
    ) -> tuple[AttemptStatus, int]:
        """Returns the status and the fence (granted/held) or position (waiting)."""
        if ticket in self.holders:
            return AttemptStatus.ALREADY_HELD, self.holders[ticket][1]
        if weight > self.effective:
            return AttemptStatus.WEIGHT_OVER_LIMIT, 0
        if partition or cap is not None or part_weight != 1:
            self.records[partition] = (cap, part_weight)
        else:
            self.records.pop("", None)
        me = self.find(ticket)
        if me is None:
            self.waiters.append(Waiter(ticket, weight, partition))
        else:  # keeps its arrival, in whichever partition it now asks
            me.weight, me.partition = weight, partition
        if ticket in self.entitled():
            self.fence += 1
            self.holders[ticket] = (weight, self.fence, partition)
            self.drop_waiter(ticket)
            return AttemptStatus.GRANTED, self.fence
        if queue:
            self.tidy()  # a partition it moved out of may be empty now
            pos = self.position(ticket)
            assert pos is not None
            return AttemptStatus.WAITING, pos
        self.drop_waiter(ticket)
        return AttemptStatus.NOT_QUEUED, 0

    def hand_off(self) -> list[tuple[str, int]]:
        """A release's handoffs: the entitled waiters are granted, in the order served."""
        out = []
        for ticket in self.entitled():
            me = self.find(ticket)
            assert me is not None
            self.fence += 1
            self.holders[ticket] = (me.weight, self.fence, me.partition)
            self.drop_waiter(ticket)
            out.append((ticket, self.fence))
        return out

    def release(self, ticket: str) -> bool:
        if ticket in self.holders:
            weight, fence, _ = self.holders.pop(ticket)
            self.succeeded(weight, fence)
            self.released.add(ticket)
            self.tidy()
            return True
        return ticket in self.released


class SemaphoreMachine(RuleBasedStateMachine):
    client: redis.Redis
    prefix: str
    aging: float  # 0 or NEVER
    handoff: bool  # waiters take handoffs (wake data HANDOFF) rather than being named

    def __init__(self) -> None:
        super().__init__()
        self.data = HANDOFF if self.handoff else PARKED
        self.handed: list[tuple[str, int]] = []  # handoffs made by the current operation
        self.sem = Semaphore(
            f"model-{uuid.uuid4().hex}",
            LIMIT,
            redis=self.client,
            key_prefix=self.prefix,
            lease_ttl=LONG,
            on_wake=self._on_wake,
            aging=self.aging,
            on_handoff=self._on_handoff if self.handoff else None,
            adaptive=True,
        )
        self.model = Model(aged=self.aging == 0)
        self.last_fence = 0
        # an expiry was injected and no operation has reclaimed it yet
        self.pending = False
        self.unreclaimed = 0  # weight of those injected lease expiries
        self.leases_expired = 0  # lease expiries injected so far
        self.unreclaimed_leases = 0  # of those, not reclaimed yet
        self.released_any = False  # a holder was released (not a re-send): a hold was timed
        self.woken: list[str] = []  # waiters named by the current operation

    def _on_wake(self, ticket: str, data: str) -> None:
        assert data == self.data
        self.woken.append(ticket)

    def _on_handoff(
        self, ticket: str, data: str, fence: int, expires_at: float, claim: str
    ) -> None:
        assert data == self.data
        self.handed.append((ticket, fence))

    def _begin(self) -> None:
        self.pending = False
        self.unreclaimed = 0
        self.unreclaimed_leases = 0
        self.woken = []
        self.handed = []

    def _check_wakes(self) -> None:
        # whoever is named now is entitled to free units: no spurious wake-ups
        entitled = self.model.entitled()
        for ticket in self.woken:
            assert ticket in entitled, (ticket, self.model)
            self.model.named.add(ticket)
        self.woken = []

    @rule(ticket=TICKETS, weight=WEIGHTS, queue=st.booleans())
    def acquire(self, ticket: str, weight: int, queue: bool) -> None:
        self._acquire(ticket, weight, queue, "", None, 1)

    @rule(
        ticket=TICKETS,
        weight=WEIGHTS,
        queue=st.booleans(),
        partition=PARTITIONS,
        cap=CAPS,
        part_weight=PART_WEIGHTS,
    )
    def acquire_in_partition(
        self,
        ticket: str,
        weight: int,
        queue: bool,
        partition: str,
        cap: int | None,
        part_weight: int,
    ) -> None:
        if cap is not None and weight > cap:
            # refused before anything is sent: nothing changes
            with pytest.raises(ValueError, match=f"weight={weight} .*partition_cap={cap}"):
                self.sem.try_acquire(ticket, weight=weight, partition=partition, partition_cap=cap)
            return
        self._acquire(ticket, weight, queue, partition, cap, part_weight)

    def _acquire(
        self,
        ticket: str,
        weight: int,
        queue: bool,
        partition: str,
        cap: int | None,
        part_weight: int,
    ) -> None:
        self._begin()
        expected, value = self.model.acquire(ticket, weight, queue, partition, cap, part_weight)
        options = {
            "weight": weight,
            "place_ttl": LONG if queue else 0.0,
            "wake_data": self.data,
            "claim": CLAIM if self.handoff else "",
            "owner": {"claim": CLAIM} if self.handoff else None,
            "wake_grace": LONG,
            "partition": partition,
            "partition_cap": cap,
            "partition_weight": part_weight,
        }
        if expected is AttemptStatus.WEIGHT_OVER_LIMIT:
            with pytest.raises(ValueError, match=f"weight={weight}"):
                self.sem.try_acquire(ticket, **options)  # type: ignore[arg-type]
            self._check_wakes()
            return
        attempt = self.sem.try_acquire(ticket, **options)  # type: ignore[arg-type]
        assert attempt.status is expected, (attempt, self.model)
        assert attempt.limit == self.model.effective
        if expected is AttemptStatus.GRANTED:
            assert attempt.permit is not None
            assert attempt.permit.fencing_token == value
            assert attempt.permit.fencing_token > self.last_fence
            self.last_fence = attempt.permit.fencing_token
        elif expected is AttemptStatus.ALREADY_HELD:
            assert attempt.permit is not None
            assert attempt.permit.fencing_token == value
        elif expected is AttemptStatus.WAITING:
            assert attempt.position == value
        else:
            assert attempt.permit is None
        self._check_wakes()

    @rule(ticket=TICKETS)
    def release(self, ticket: str) -> None:
        self._begin()
        self.released_any = self.released_any or ticket in self.model.holders
        assert self.sem.release_token(ticket, tombstone_ttl=LONG) is self.model.release(ticket)
        expected = self.model.hand_off() if self.handoff else []
        assert self.handed == expected, (self.handed, expected, self.model)
        if expected:
            self.last_fence = expected[-1][1]
        self._check_wakes()

    @rule(ticket=TICKETS)
    def refresh(self, ticket: str) -> None:
        self._begin()
        expected = ticket in self.model.holders or self.model.position(ticket) is not None
        assert (self.sem.refresh_token(ticket) is not None) is expected
        assert (self.sem.refresh_token(ticket, holder_only=True) is not None) is (
            ticket in self.model.holders
        )
        self._check_wakes()

    @rule(ticket=TICKETS)
    def withdraw(self, ticket: str) -> None:
        self._begin()
        assert self.sem.withdraw(ticket) is self.model.drop_waiter(ticket)
        self._check_wakes()

    @precondition(lambda self: bool(self.model.holders))
    @rule(data=st.data())
    def expire_lease(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(sorted(self.model.holders)))
        # inject the fault: the lease ran out long ago; the next operation reclaims it
        assert self.client.zadd(self.sem.keys.expiry, {"h:" + ticket: 0}, xx=True, ch=True) == 1
        self.unreclaimed += self.model.holders.pop(ticket)[0]
        self.leases_expired += 1
        self.unreclaimed_leases += 1
        self.model.tidy()
        self.pending = True

    @precondition(lambda self: bool(self.model.waiters))
    @rule(data=st.data())
    def expire_place(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(sorted(w.ticket for w in self.model.waiters)))
        assert self.client.zadd(self.sem.keys.expiry, {"w:" + ticket: 0}, xx=True, ch=True) == 1
        self.model.drop_waiter(ticket)
        self.pending = True

    @rule(limit=st.one_of(st.none(), st.integers(min_value=1, max_value=LIMIT + 2)))
    def override(self, limit: int | None) -> None:
        self._begin()
        self.sem.set_limit_override(limit)
        self.model.override = limit
        self._check_wakes()

    @rule(data=st.data())
    def throttle(self, data: st.DataObject) -> None:
        self._begin()
        # the fencing token of any permit granted so far, held or not
        fence = data.draw(st.integers(min_value=1, max_value=max(1, self.model.fence)))
        result = self.sem.throttled(fencing_token=fence)
        assert result.decreased is self.model.throttle(fence, result.decreased), self.model
        assert result.effective_limit == self.model.cap_now
        assert result.paused_for is None
        self._check_wakes()

    @rule()
    def reclaim(self) -> None:
        self._begin()
        self.sem.reclaim()
        self._check_wakes()

    @invariant()
    def matches_model(self) -> None:
        snap = self.sem.inspect()
        assert snap.limit == self.model.effective
        assert snap.limit_override == self.model.override
        assert {
            h.token: (h.weight, h.fencing_token, h.partition) for h in snap.holders
        } == self.model.holders
        assert [(w.ticket, w.weight, w.partition, w.position) for w in snap.waiters] == [
            (w.ticket, w.weight, w.partition, self.model.position(w.ticket))
            for w in self.model.waiters
        ]
        parts = [
            (
                name,
                self.model.part_used(name),
                sum(1 for w in self.model.waiters if w.partition == name),
                *self.model.records.get(name, (None, 1)),
            )
            for name in sorted(self.model.active())
        ]
        assert [(p.name, p.used, p.waiters, p.cap, p.weight) for p in snap.partitions] == parts
        assert snap.used == self.model.used
        assert snap.available == max(0, self.model.cap_now - self.model.used)
        assert snap.effective_limit == self.model.cap_now
        assert snap.adaptive_limit == (self.model.cwnd if self.model.cap_now < snap.limit else None)
        # the counter the scripts keep agrees, counting leases expired by the last rule (which
        # the next operation reclaims)
        raw = self.client.hget(self.sem.keys.state, "used")
        assert int(raw or 0) == self.model.used + self.unreclaimed
        # the operator counters: every injected lease expiry reclaimed counts once; the hold
        # average exists once a holder was released (re-sends and expiries are no holds)
        assert snap.reclaimed_total == self.leases_expired - self.unreclaimed_leases
        assert (snap.hold_time_avg is not None) is self.released_any
        if not self.pending:
            # no partition record outlives its partition's holders and waiters
            fields = {_str(f) for f in self.client.hkeys(self.sem.keys.state)}
            records = {f[2:] for f in fields if f.startswith("p:")}
            assert records == set(self.model.records), (records, self.model)
            assert int(self.client.hget(self.sem.keys.state, "pused") or 0) == sum(
                w for w, _, p in self.model.holders.values() if p
            )

    @invariant()
    def entitled_waiters_were_woken(self) -> None:
        # no lost wake-ups: every waiter that free units belong to has been named since it
        # joined the line, by whichever operation made the units its (an injected expiry is
        # only noticed by the next operation)
        if not self.pending:
            for ticket in self.model.entitled():
                assert ticket in self.model.named, (ticket, self.model)


NEVER = 3600.0  # an aging that never passes during an example


@pytest.mark.parametrize(
    ("aging", "handoff"),
    [(NEVER, False), (0.0, False), (NEVER, True)],
    ids=["not-aged", "aged", "handoff"],
)
def test_semaphore_matches_model(
    redis_client: redis.Redis, key_prefix: str, aging: float, handoff: bool
) -> None:
    SemaphoreMachine.client = redis_client
    SemaphoreMachine.prefix = key_prefix
    SemaphoreMachine.aging = aging
    SemaphoreMachine.handoff = handoff
    run_state_machine_as_test(
        SemaphoreMachine,
        settings=settings(
            max_examples=200,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
