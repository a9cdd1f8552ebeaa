"""A standby's acknowledgement: held until its grant for a task that is not acks_late; left
to Celery for an acks_late task (acknowledging one at its grant lost it when its process was
then killed: reject_on_worker_lost could no longer requeue it)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from celery_semaphore.integration import acks


class _Request:
    """What acks touches of Celery's Request: its task, acknowledge and the pool's handlers."""

    def __init__(self, acks_late: bool) -> None:
        self.task = SimpleNamespace(acks_late=acks_late)
        self.acked = 0
        self.ended: list[str] = []

    def acknowledge(self) -> None:
        self.acked += 1

    def on_accepted(self, *args: Any) -> None:  # Celery's acknowledges unless acks_late
        if not self.task.acks_late:
            self.acknowledge()

    def on_success(self, *args: Any) -> None:
        self.ended.append("success")

    def on_failure(self, *args: Any) -> None:
        self.ended.append("failure")

    def on_retry(self, *args: Any) -> None:
        self.ended.append("retry")


def test_held_until_granted_when_not_acks_late() -> None:
    req = _Request(acks_late=False)
    acks.hold_until_granted(req)
    req.on_accepted(1, 0.0)
    assert req.acked == 0  # accepted: not yet
    acks.granted(req)
    assert req.acked == 1


def test_acknowledged_when_it_ends_without_a_grant() -> None:
    req = _Request(acks_late=False)
    acks.hold_until_granted(req)
    req.on_accepted(1, 0.0)
    req.on_failure(None)  # parked (Ignore), or failed
    assert req.ended == ["failure"]
    assert req.acked == 1


def test_an_acks_late_task_is_left_to_celery() -> None:
    req = _Request(acks_late=True)
    acks.hold_until_granted(req)
    req.on_accepted(1, 0.0)
    acks.granted(req)  # its grant: no acknowledgement (Celery's, when it ends)
    assert req.acked == 0
