"""Random operation sequences against a plain-Python model of the semaphore.

The model: a limit (the Semaphore's, or a runtime override), holders (ticket -> weight, fencing
token), and one FIFO line of waiters (ticket, weight).  Free units belong to the oldest waiters
that fit, strictly in order (a head that does not fit blocks everyone behind it; a waiter
heavier than the whole limit is skipped).  Lease and place expiry are injected deterministically
by setting a score in Redis to 0, which the next operation reclaims.
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

LIMIT = 4
TICKETS = st.sampled_from([f"t{i}" for i in range(6)])
WEIGHTS = st.integers(min_value=1, max_value=LIMIT)
LONG = 60.0  # leases, places and tombstones never run out on their own during an example
PARKED = "parked"  # wake data: wake-ups come to on_wake, where the machine records them


@dataclass
class Model:
    limit: int = LIMIT
    override: int | None = None
    holders: dict[str, tuple[int, int]] = field(default_factory=dict)  # ticket -> weight, fence
    waiters: list[tuple[str, int]] = field(default_factory=list)  # FIFO: ticket, weight
    released: set[str] = field(default_factory=set)  # tombstones
    named: set[str] = field(default_factory=set)  # waiters named in a wake-up since they queued
    fence: int = 0

    @property
    def effective(self) -> int:
        return self.override if self.override is not None else self.limit

    @property
    def used(self) -> int:
        return sum(w for w, _ in self.holders.values())

    def entitled(self) -> list[str]:
        free = self.effective - self.used
        out: list[str] = []
        for ticket, weight in self.waiters:
            if free <= 0:
                break
            if weight > self.effective:
                continue  # can never fit: skipped, not blocking
            if weight > free:
                break  # strict FIFO
            free -= weight
            out.append(ticket)
        return out

    def position(self, ticket: str) -> int | None:
        for i, (t, _) in enumerate(self.waiters):
            if t == ticket:
                return i
        return None

    def drop_waiter(self, ticket: str) -> bool:
        i = self.position(ticket)
        if i is None:
            return False
        del self.waiters[i]
        self.named.discard(ticket)
        return True

    def acquire(self, ticket: str, weight: int, queue: bool) -> tuple[AttemptStatus, int]:
        """Returns the status and the fence (granted/held) or position (waiting)."""
        if ticket in self.holders:
            return AttemptStatus.ALREADY_HELD, self.holders[ticket][1]
        if weight > self.effective:
            return AttemptStatus.WEIGHT_OVER_LIMIT, 0
        i = self.position(ticket)
        if i is None:
            self.waiters.append((ticket, weight))
        else:
            self.waiters[i] = (ticket, weight)
        if ticket in self.entitled():
            self.drop_waiter(ticket)
            self.fence += 1
            self.holders[ticket] = (weight, self.fence)
            return AttemptStatus.GRANTED, self.fence
        if queue:
            pos = self.position(ticket)
            assert pos is not None
            return AttemptStatus.WAITING, pos
        self.drop_waiter(ticket)
        return AttemptStatus.NOT_QUEUED, 0

    def release(self, ticket: str) -> bool:
        if ticket in self.holders:
            del self.holders[ticket]
            self.released.add(ticket)
            return True
        return ticket in self.released


class SemaphoreMachine(RuleBasedStateMachine):
    client: redis.Redis
    prefix: str

    def __init__(self) -> None:
        super().__init__()
        self.sem = Semaphore(
            f"model-{uuid.uuid4().hex}",
            LIMIT,
            redis=self.client,
            key_prefix=self.prefix,
            lease_ttl=LONG,
            on_wake=self._on_wake,
        )
        self.model = Model()
        self.last_fence = 0
        # an expiry was injected and no operation has reclaimed it yet
        self.pending = False
        self.unreclaimed = 0  # weight of those injected lease expiries
        self.woken: list[str] = []  # waiters named by the current operation

    def _on_wake(self, ticket: str, data: str) -> None:
        assert data == PARKED
        self.woken.append(ticket)

    def _begin(self) -> None:
        self.pending = False
        self.unreclaimed = 0
        self.woken = []

    def _check_wakes(self) -> None:
        # whoever is named now is entitled to free units: no spurious wake-ups
        entitled = self.model.entitled()
        for ticket in self.woken:
            assert ticket in entitled, (ticket, self.model)
            self.model.named.add(ticket)
        self.woken = []

    @rule(ticket=TICKETS, weight=WEIGHTS, queue=st.booleans())
    def acquire(self, ticket: str, weight: int, queue: bool) -> None:
        self._begin()
        expected, value = self.model.acquire(ticket, weight, queue)
        place = LONG if queue else 0.0
        if expected is AttemptStatus.WEIGHT_OVER_LIMIT:
            with pytest.raises(ValueError, match=f"weight={weight}"):
                self.sem.try_acquire(ticket, weight=weight, place_ttl=place, wake_data=PARKED)
            self._check_wakes()
            return
        attempt = self.sem.try_acquire(ticket, weight=weight, place_ttl=place, wake_data=PARKED)
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
        assert self.sem.release_token(ticket, tombstone_ttl=LONG) is self.model.release(ticket)
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
        self.pending = True

    @precondition(lambda self: bool(self.model.waiters))
    @rule(data=st.data())
    def expire_place(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(sorted(t for t, _ in self.model.waiters)))
        assert self.client.zadd(self.sem.keys.expiry, {"w:" + ticket: 0}, xx=True, ch=True) == 1
        self.model.drop_waiter(ticket)
        self.pending = True

    @rule(limit=st.one_of(st.none(), st.integers(min_value=1, max_value=LIMIT + 2)))
    def override(self, limit: int | None) -> None:
        self._begin()
        self.sem.set_limit_override(limit)
        self.model.override = limit
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
        assert {h.token: (h.weight, h.fencing_token) for h in snap.holders} == self.model.holders
        assert [(w.ticket, w.weight) for w in snap.waiters] == self.model.waiters
        assert snap.used == self.model.used
        assert snap.available == max(0, self.model.effective - self.model.used)
        # the counter the scripts keep agrees, counting leases expired by the last rule (which
        # the next operation reclaims)
        raw = self.client.hget(self.sem.keys.state, "used")
        assert int(raw or 0) == self.model.used + self.unreclaimed

    @invariant()
    def entitled_waiters_were_woken(self) -> None:
        # no lost wake-ups: every waiter that free units belong to has been named since it
        # joined the line, by whichever operation made the units its (an injected expiry is
        # only noticed by the next operation)
        if not self.pending:
            for ticket in self.model.entitled():
                assert ticket in self.model.named, (ticket, self.model)


def test_semaphore_matches_model(redis_client: redis.Redis, key_prefix: str) -> None:
    SemaphoreMachine.client = redis_client
    SemaphoreMachine.prefix = key_prefix
    run_state_machine_as_test(
        SemaphoreMachine,
        settings=settings(
            max_examples=300,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
