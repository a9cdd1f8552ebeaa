"""The items on a gate's wake list: each tagged with its kind, so a task id never passes for a
handoff (issue 17, defect 3: a task id ``+1 2 <victim id>`` read as a handoff)."""

from __future__ import annotations

import pytest

from celery_semaphore.core.semaphore import HANDOFF_MARK
from celery_semaphore.integration import wakes


@pytest.mark.parametrize(
    "ticket",
    [
        "3f2a:0",
        "+1 2 victim:0",  # the old handoff format, as a task id
        "h 1 2 claim victim:0",  # the new one, as a task id
        "w x",
        "with spaces and\nnewlines:1",
    ],
)
def test_a_wake_up_reads_back_as_a_wake_up_of_the_same_ticket(ticket: str) -> None:
    assert wakes.parse(wakes.wake_item(ticket)) == wakes.Wake(ticket)


def test_a_handoff_reads_back_with_its_fence_expiry_and_claim() -> None:
    item = wakes.handoff_item("h 9 9 forged t:0", 42, 1_700_000_000.25, "c0ffee")
    assert wakes.parse(item) == wakes.Handoff("h 9 9 forged t:0", 42, 1_700_000_000.25, "c0ffee")


@pytest.mark.parametrize(
    "item",
    ["", "+1 2 victim:0", "victim:0", "h 1 2", "h x 2 c t:0", "h 1 2  t:0", "w", "x 1"],
)
def test_anything_else_is_not_an_item(item: str) -> None:
    assert wakes.parse(item) is None


def test_a_cancel_reads_back_with_its_claim_and_ticket() -> None:
    item = wakes.cancel_item("x c0ffee forged:0", "c0ffee")
    assert wakes.parse(item) == wakes.Cancel("x c0ffee forged:0", "c0ffee")
    assert wakes.parse("x c0ffee") is None  # no ticket
    assert wakes.parse("x  t:0") is None  # no claim
    assert wakes.parse("s c0ffee t:0") is None  # not an item (any more)


def test_a_standby_list_shares_its_gate_lists_slot_and_keeps_its_gates_wake_data() -> None:
    gate = wakes.gate_key("p", "node@host", "abc123")
    key = wakes.standby_key(gate, "c0ffee")
    assert key.startswith(gate)  # the gate's hash tag first: the same Redis Cluster slot
    # the place of a task standing by still names its gate (which forwards), taking handoffs
    assert wakes.gate_wake_data(key) == "@" + gate + HANDOFF_MARK
