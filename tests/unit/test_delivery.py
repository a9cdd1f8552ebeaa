"""A delivery's stages and moves, the directive the gate hands the body, and the wait state a
parked copy carries (issue 17: one explicit state machine per delivery)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from celery_semaphore import SemaphoreRequestError
from celery_semaphore.integration import delivery
from celery_semaphore.integration.delivery import (
    GATE_HEADER,
    HOLDING,
    TRANSITIONS,
    Delivery,
    Directive,
    IllegalMove,
    Stage,
)
from celery_semaphore.integration.wait_state import WaitState


def test_every_stage_has_its_moves_and_the_last_ones_have_none() -> None:
    assert set(TRANSITIONS) == set(Stage)
    assert TRANSITIONS[Stage.DONE] == frozenset()
    assert TRANSITIONS[Stage.REVOKED] == frozenset()
    assert TRANSITIONS[Stage.GIVEN_BACK] == frozenset()


def test_every_way_out_of_the_gate_hands_the_place_over_or_withdraws_it() -> None:
    """Out of RECEIVED and HELD, a delivery goes with its grant (GRANTED), with its place and
    claim (HANDED_OVER), or leaves the line (TIMED_OUT, REVOKED, GIVEN_BACK): nothing else."""
    with_claim = {Stage.GRANTED, Stage.HANDED_OVER}
    withdrawn = {Stage.TIMED_OUT, Stage.REVOKED, Stage.GIVEN_BACK}
    for stage in HOLDING:
        assert TRANSITIONS[stage] - {Stage.HELD} == with_claim | withdrawn, stage


def test_a_delivery_moves_only_as_the_table_allows() -> None:
    d = Delivery("t:0", "c")
    assert d.stage.value == "received"
    for stage in (Stage.HELD, Stage.GRANTED, Stage.RUNNING, Stage.DONE):
        d.move(stage)
    assert d.stage is Stage.DONE
    with pytest.raises(IllegalMove, match=r"t:0: done -> running"):
        d.move(Stage.RUNNING)
    running = Delivery("u:0", "c")
    running.move(Stage.GRANTED)
    running.move(Stage.RUNNING)
    with pytest.raises(IllegalMove):
        running.move(Stage.HANDED_OVER)  # its grant went with it: no place to hand over
    running.move(Stage.GIVEN_BACK)  # the pool stopped without starting it
    with pytest.raises(IllegalMove):
        running.move(Stage.DONE)


@pytest.fixture
def nonce() -> str:
    return delivery.gate_nonce()


def _request(directive: dict[str, object] | None, task_id: str = "t", retries: int = 0) -> object:
    return SimpleNamespace(id=task_id, retries=retries, **{GATE_HEADER: directive})


def test_a_directive_travels_to_the_body_and_back(nonce: str) -> None:
    sent = Directive(nonce, "t:0", "claim", "run", "bulk", (3, 4), 1_700_000_000.5, 1.25)
    assert Directive.from_request(_request(sent.to_request())) == sent


@pytest.mark.parametrize(
    "change",
    [
        {"nonce": "another worker's"},
        {"ticket": "other:0"},
        {"fencing": "not a list of ints"},
        {"do": None, "claim": None, "partition": None} | {"expires_at": "soon"},
    ],
    ids=["other-worker", "other-execution", "bad-fencing", "bad-expiry"],
)
def test_a_directive_this_gate_did_not_make_for_this_execution_is_ignored(
    nonce: str, change: dict[str, object]
) -> None:
    raw = Directive(nonce, "t:0", "claim", "run", "", (1,), 1.0).to_request() | change
    assert Directive.from_request(_request(raw)) is None
    assert Directive.from_request(_request(None)) is None


def test_the_wait_state_carries_the_claim_of_the_delivery_that_parked_it() -> None:
    state = WaitState(2, 3, 100.0, True, "bulk", "parked-by")
    assert WaitState.from_headers(state.header(1), 1) == state
    assert WaitState.from_headers(state.header(1), 2) == WaitState()  # another execution
    assert WaitState.from_headers({**state.header(0), "pc": 7}, 0).claim_before is None


def test_a_delivery_arriving_starts_its_wait_and_knows_a_redelivery() -> None:
    fresh = WaitState().on_arrival(redelivered=False, partition="a")
    assert fresh.first_wait is not None
    assert (fresh.takeover, fresh.partition) == (False, "a")
    again = WaitState(1, 1, 5.0).on_arrival(redelivered=True, partition="b")
    assert (again.first_wait, again.takeover, again.partition) == (5.0, True, "b")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("e", float("inf")),
        ("e", float("nan")),
        ("e", -1),
        ("e", "3"),
        ("n", 1.5),
        ("n", [1]),
        ("t0", float("inf")),
        ("t0", "yesterday"),
        ("t0", -5.0),
    ],
)
def test_a_malformed_wait_header_is_a_clear_error(field: str, value: object) -> None:
    raw = {"r": 0, "e": 1, "n": 2, "t0": 1_700_000_000.0, field: value}
    with pytest.raises(SemaphoreRequestError) as info:
        WaitState.from_headers(raw, 0)
    assert "'semaphore_wait' header is malformed" in str(info.value)
    assert repr(field) in str(info.value)


def test_a_wait_header_of_another_attempt_is_void_even_if_malformed() -> None:
    assert WaitState.from_headers({"r": 3, "e": float("inf")}, 0) == WaitState()
