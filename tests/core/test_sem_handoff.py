"""Handoff: a release by a Semaphore with ``on_handoff`` grants the freed units straight to the
waiters that take handoffs (wake data ending with ``HANDOFF_MARK``; the grant's claim is the
waiter's ``owner["claim"]``), in the same script, instead of naming them to come and claim
them.  Order, partitions, caps and weights are the same as for named waiters; everyone else is
still named through ``on_wake``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from celery_semaphore import Semaphore
from celery_semaphore.core.semaphore import HANDOFF_MARK, AttemptStatus

SemaphoreFactory = Callable[..., Semaphore]

GATE = "@gate:node-1:abc" + HANDOFF_MARK  # what a worker's gate gives as wake data
CLAIM = "claim-of-this-delivery"


@dataclass
class Calls:
    wakes: list[tuple[str, str]] = field(default_factory=list)
    handoffs: list[tuple[str, str, int, float]] = field(default_factory=list)
    claims: list[str] = field(default_factory=list)

    def on_wake(self, ticket: str, data: str) -> None:
        self.wakes.append((ticket, data))

    def on_handoff(self, ticket: str, data: str, fence: int, expires_at: float, claim: str) -> None:
        self.handoffs.append((ticket, data, fence, expires_at))
        self.claims.append(claim)


@pytest.fixture
def calls() -> Calls:
    return Calls()


def make(
    make_semaphore: SemaphoreFactory, calls: Calls, name: str, limit: int, **kw: Any
) -> Semaphore:
    return make_semaphore(
        name, limit, lease_ttl=30, on_wake=calls.on_wake, on_handoff=calls.on_handoff, **kw
    )


def wait_handoff(
    sem: Semaphore, ticket: str, owner: dict[str, Any] | None = None, **kw: Any
) -> None:
    owner = {"claim": CLAIM, **(owner or {})}
    attempt = sem.try_acquire(ticket, place_ttl=30, claim=CLAIM, wake_data=GATE, owner=owner, **kw)
    assert attempt.status is AttemptStatus.WAITING, attempt


def hold(sem: Semaphore, ticket: str, **kw: Any) -> int:
    attempt = sem.try_acquire(ticket, place_ttl=30, **kw)
    assert attempt.status is AttemptStatus.GRANTED, attempt
    assert attempt.permit is not None
    return attempt.permit.fencing_token


def test_a_release_grants_the_freed_unit_to_a_handoff_waiter(
    make_semaphore: SemaphoreFactory, calls: Calls
) -> None:
    sem = make(make_semaphore, calls, "one", 1)
    first = hold(sem, "h")
    wait_handoff(sem, "w", owner={"task_id": "w-id"})
    assert calls.handoffs == []

    assert sem.release_token("h") is True

    assert calls.wakes == []  # granted, not named
    [(ticket, data, fence, expires_at)] = calls.handoffs
    assert (ticket, data) == ("w", GATE)
    assert fence == first + 1
    assert calls.claims == [CLAIM]  # the receiver learns the claim the grant was made under
    snap = sem.inspect()
    assert snap.used == 1
    assert snap.waiters == []
    [holder] = snap.holders
    assert (holder.token, holder.fencing_token) == ("w", fence)
    assert holder.owner == {"claim": CLAIM, "task_id": "w-id"}
    # the lease is the releasing semaphore's lease_ttl, from the release
    assert expires_at == pytest.approx(snap.server_time + 30, abs=2)
    # a claim attempt (a handoff lost on its way) finds the same grant
    again = sem.try_acquire("w", place_ttl=30, claim=CLAIM, wake_data=GATE)
    assert again.status is AttemptStatus.ALREADY_HELD
    assert again.permit is not None
    assert again.permit.fencing_token == fence
    # only the claim it was granted under refreshes it, or releases it
    assert sem.refresh_token("w", claim="another copy", holder_only=True) is None
    assert sem.refresh_token("w", claim=CLAIM, holder_only=True) is not None
    assert sem.release_token("w", claim="another copy") is False
    assert sem.release_token("w", claim=CLAIM) is True
    assert sem.inspect().used == 0


def test_a_waiter_whose_owner_names_no_claim_is_named(
    make_semaphore: SemaphoreFactory, calls: Calls
) -> None:
    sem = make(make_semaphore, calls, "no-claim", 3)
    for i in range(3):
        hold(sem, f"h{i}")
    owners: list[tuple[str, dict[str, Any]]] = [
        ("w1", {"task_id": "x"}),
        ("w2", {"claim": ""}),
        ("w3", {"claim": 7}),
    ]
    for ticket, owner in owners:
        attempt = sem.try_acquire(ticket, place_ttl=30, wake_data=GATE, owner=owner)
        assert attempt.status is AttemptStatus.WAITING
    for i in range(3):
        sem.release_token(f"h{i}")
    assert calls.handoffs == []
    assert calls.wakes == [("w1", GATE), ("w2", GATE), ("w3", GATE)]
    assert sem.inspect().used == 0


def test_a_resent_release_hands_off_nothing_more(
    make_semaphore: SemaphoreFactory, calls: Calls
) -> None:
    sem = make(make_semaphore, calls, "resent", 1)
    hold(sem, "h")
    wait_handoff(sem, "w1")
    wait_handoff(sem, "w2")
    assert sem.release_token("h") is True
    assert sem.release_token("h") is True  # the tombstone: released already
    assert [h[0] for h in calls.handoffs] == ["w1"]
    snap = sem.inspect()
    assert snap.used == 1
    assert [w.ticket for w in snap.waiters] == ["w2"]


def test_the_line_order_holds_between_named_and_handed_off_waiters(
    make_semaphore: SemaphoreFactory, calls: Calls
) -> None:
    sem = make(make_semaphore, calls, "order", 1)
    hold(sem, "h")
    parked = sem.try_acquire("p1", place_ttl=30, wake_data='{"parked": 1}')
    assert parked.status is AttemptStatus.WAITING
    wait_handoff(sem, "w2")

    sem.release_token("h")
    # p1 came first: it is named (it claims its unit itself); w2 gets nothing yet
    assert calls.wakes == [("p1", '{"parked": 1}')]
    assert calls.handoffs == []
    hold(sem, "p1", wake_data='{"parked": 1}')
    sem.release_token("p1")
    assert [h[0] for h in calls.handoffs] == ["w2"]


def test_without_on_handoff_or_with_handoff_false_the_waiter_is_named(
    make_semaphore: SemaphoreFactory, calls: Calls
) -> None:
    plain = make_semaphore("named", 1, lease_ttl=30, on_wake=calls.on_wake)
    hold(plain, "h")
    wait_handoff(plain, "w")
    plain.release_token("h")
    assert calls.wakes == [("w", GATE)]
    assert calls.handoffs == []
    assert plain.inspect().used == 0
    granted = plain.try_acquire("w", place_ttl=30, claim=CLAIM, wake_data=GATE)
    assert granted.status is AttemptStatus.GRANTED

    sem = make(make_semaphore, calls, "named-2", 1)
    hold(sem, "h")
    wait_handoff(sem, "w")
    sem.release_token("h", handoff=False)
    assert calls.handoffs == []
    assert calls.wakes[-1] == ("w", GATE)
    assert sem.inspect().used == 0


def test_partition_caps_and_accounting_hold_for_handoffs(
    make_semaphore: SemaphoreFactory, calls: Calls
) -> None:
    sem = make(make_semaphore, calls, "parts", 3)
    for i in range(3):
        hold(sem, f"h{i}")
    for i in range(3):
        wait_handoff(sem, f"a{i}", partition="a", partition_cap=1)
    wait_handoff(sem, "b0", partition="b")

    sem.release_token("h0")
    sem.release_token("h1")
    # fair shares: one each to a and b; a's cap stops a second grant in a
    assert sorted(h[0] for h in calls.handoffs) == ["a0", "b0"]
    snap = sem.inspect()
    parts = {p.name: p for p in snap.partitions}
    assert parts["a"].used == 1
    assert parts["a"].waiters == 2
    assert parts["a"].cap == 1
    assert parts["b"].used == 1
    assert parts["b"].waiters == 0
    assert snap.used == 3
    sem.release_token("h2")
    assert len(calls.handoffs) == 2  # the free unit is a's, but a is at its cap
    assert sem.release_token("a0", claim=CLAIM) is True
    assert [h[0] for h in calls.handoffs][-1] == "a1"
    snap = sem.inspect()
    assert {p.name: p.used for p in snap.partitions}["a"] == 1
    assert snap.used == 2


def test_a_heavy_waiter_is_handed_its_units_when_they_all_fit(
    make_semaphore: SemaphoreFactory, calls: Calls
) -> None:
    sem = make(make_semaphore, calls, "weights", 2)
    hold(sem, "h1")
    hold(sem, "h2")
    wait_handoff(sem, "heavy", weight=2)
    sem.release_token("h1")
    assert calls.handoffs == []
    sem.release_token("h2")
    assert [h[0] for h in calls.handoffs] == ["heavy"]
    snap = sem.inspect()
    assert snap.used == 2
    assert [(h.token, h.weight) for h in snap.holders] == [("heavy", 2)]


def test_a_failing_on_handoff_leaves_the_grant_to_be_claimed(
    make_semaphore: SemaphoreFactory,
) -> None:
    def broken(ticket: str, data: str, fence: int, expires_at: float) -> None:
        raise RuntimeError("receiver gone")

    sem = make_semaphore("broken", 1, lease_ttl=30, on_wake=lambda t, d: None, on_handoff=broken)
    hold(sem, "h")
    wait_handoff(sem, "w")
    assert sem.release_token("h") is True  # the release itself succeeded
    again = sem.try_acquire("w", place_ttl=30, claim=CLAIM, wake_data=GATE)
    assert again.status is AttemptStatus.ALREADY_HELD


def test_the_grant_takes_the_waiters_own_lease_when_its_owner_names_one(
    make_semaphore: SemaphoreFactory, calls: Calls
) -> None:
    """A releaser with a 30 s lease hands off to a task whose own lease is 300 s (its heartbeat
    refreshes every 100 s): the grant must last the receiver's lease, not the releaser's."""
    sem = make(make_semaphore, calls, "leases", 2)
    hold(sem, "h1")
    hold(sem, "h2")
    wait_handoff(sem, "long", owner={"lease_ms": 300_000})
    wait_handoff(sem, "odd", owner={"lease_ms": "300000"})  # not a number: the releaser's
    sem.release_token("h1")
    sem.release_token("h2")
    now = sem.inspect().server_time
    expiry = {ticket: expires_at for ticket, _, _, expires_at in calls.handoffs}
    assert expiry["long"] == pytest.approx(now + 300, abs=2)
    assert expiry["odd"] == pytest.approx(now + 30, abs=2)
    remaining = {h.token: h.lease_remaining for h in sem.holders()}
    assert remaining["long"] > 290
    assert remaining["odd"] < 31
