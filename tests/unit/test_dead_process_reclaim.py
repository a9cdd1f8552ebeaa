"""A redelivered copy takes back its previous delivery's permit only from a process it can
see is dead (same machine *and* PID namespace), and only under the claim that process held
(issue 17: containers that share a hostname but not a PID namespace; no release by name)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from celery_semaphore import Semaphore
from celery_semaphore.integration.delivery import host_owner
from celery_semaphore.integration.slot import _reclaim_from_dead_process

SemaphoreFactory = Callable[..., Semaphore]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


def _held_by(sem: Semaphore, **owner: Any) -> str:
    ticket = "T:0"
    granted = sem.try_acquire(ticket, claim="dead-delivery", owner=owner, lease_ttl=60)
    assert granted.permit is not None
    return ticket


def _here(**changes: Any) -> dict[str, Any]:
    return {**host_owner("T", "t", "node"), "pid": _dead_pid(), "claim": "dead-delivery", **changes}


def test_a_dead_process_here_is_reclaimed_under_its_claim(
    make_semaphore: SemaphoreFactory,
) -> None:
    sem = make_semaphore("dead", 1)
    ticket = _held_by(sem, **_here())
    assert _reclaim_from_dead_process(sem, ticket) is True
    assert sem.holders() == []


@pytest.mark.parametrize(
    "changes",
    [
        {"pidns": "pid:[4026530000]"},  # a container with our hostname, not our processes
        {"machine": "another-host"},
        {"claim": None},  # no claim to release under: left to its lease
    ],
    ids=["other-pid-namespace", "other-machine", "no-claim"],
)
def test_a_holder_this_process_cannot_judge_is_left_alone(
    make_semaphore: SemaphoreFactory, changes: dict[str, Any]
) -> None:
    sem = make_semaphore("dead", 1)
    ticket = _held_by(sem, **_here(**changes))
    assert _reclaim_from_dead_process(sem, ticket) is False
    assert [h.token for h in sem.holders()] == [ticket]
    sem.release_token(ticket, claim="dead-delivery")


def test_a_grant_made_meanwhile_under_another_claim_is_never_released(
    make_semaphore: SemaphoreFactory,
) -> None:
    """The owner names a claim that no longer holds (the ticket was granted again to another
    delivery meanwhile): the release under the dead one's claim leaves it alone."""
    sem = make_semaphore("dead", 1)
    owner = _here(claim="an-older-claim")
    ticket = _held_by(sem, **owner)  # granted under "dead-delivery", owner says otherwise
    assert _reclaim_from_dead_process(sem, ticket) is False
    assert [h.token for h in sem.holders()] == [ticket]
    sem.release_token(ticket, claim="dead-delivery")


def test_a_grant_taken_back_on_a_lost_state_is_not_run(
    make_semaphore: SemaphoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The permit of the dead process is taken back, and the copy is granted; but the grant
    was made on a state Redis lost (a restart, faked here): it is given back and the copy
    parks, never running on the grant it gave back.  (Before, the copy ran on it.)"""
    from celery_semaphore.core.exceptions import SemaphoreBackendError
    from celery_semaphore.integration import asking, slot
    from celery_semaphore.integration.wait_state import WaitState

    sem = make_semaphore("dead-lost", 1)
    ticket = _held_by(sem, **_here())

    def lost(lock: Any) -> None:
        raise SemaphoreBackendError("the state was lost")

    monkeypatch.setattr(asking, "lost_at_grant", lambda lock, permit: True)
    monkeypatch.setattr(asking, "quarantine_guard", lost)
    monkeypatch.setattr(slot, "quarantine_guard", lambda lock: None)
    monkeypatch.setattr(slot, "log_unavailable", lambda task, sem, exc: None)
    parked: list[str] = []

    def park(run: Any, state: Any, t: str, common: Any, registered: bool) -> Any:
        parked.append(t)
        return "parked"

    monkeypatch.setattr(slot, "park", park)
    held = sem.try_acquire(ticket, claim="copy")  # the dead delivery holds it
    assert held.permit is None
    run: Any = type("Run", (), {"sem": sem, "task": None})()
    out: Any = slot._take_over(run, WaitState(), ticket, {"claim": "copy"}, held)
    assert out == "parked"
    assert parked == [ticket]
    assert sem.holders() == []  # the grant went back
