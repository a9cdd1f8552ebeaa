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
from celery_semaphore.integration.body import _reclaim_from_dead_process
from celery_semaphore.integration.delivery import host_owner

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
