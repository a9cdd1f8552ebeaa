"""The wait state of an execution: how it has waited so far, carried by each copy of it.

A task that parks is published again with the ``semaphore_wait`` message header
(:data:`HEADER`): when its execution first asked (``max_wait`` counts from then), how many
times it waited, its epoch (a copy of an execution that may have run already is dropped when
it finds its ticket done), whether it takes over a previous delivery's permit, the partition
it waits in, and the claims of the deliveries that parked it.  A header comes with the
message, so it is checked field by field: a malformed one fails the task, never the worker.
"""

from __future__ import annotations

import math
import reprlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..core.exceptions import SemaphoreRequestError

__all__ = ["CLAIM_CHAIN", "HEADER", "WaitState", "copy_of_execution", "stamp_wait"]

#: the message header of a parked copy: how its execution has waited so far (see WaitState)
HEADER = "semaphore_wait"
#: the most claims of ended deliveries a copy carries (WaitState.claim_before and
#: .claims_earlier).  Only a Redis outage that fails this many deliveries in a row, each before
#: it gave back the grant of the one before, loses track of a grant: the copy then takes it for
#: a live copy's and drops
CLAIM_CHAIN = 8


@dataclass(frozen=True)
class WaitState:
    """The ``semaphore_wait`` header: how this copy of the task has waited so far."""

    epoch: int = 0
    waits: int = 0
    first_wait: float | None = None
    #: this copy continues a redelivered execution whose permit may still be held by the
    #: previous delivery (alive past a visibility timeout, or dead until its lease expires)
    takeover: bool = False
    #: the partition this execution waits in (fixed at its first attempt)
    partition: str | None = None
    #: the claim of the delivery that parked this copy: a grant a release handed off to the
    #: place under that claim after it parked (while Redis failed, the place could not be
    #: told) belongs to nobody, and this copy takes it back (see asking.ask)
    claim_before: str | None = None
    #: the claims of the deliveries that parked the copies before, newest first (at most
    #: CLAIM_CHAIN - 1): a delivery that Redis failed before it could give back its
    #: predecessor's grant (a reply lost on the wire) parks with its own claim, and the grant
    #: is still under the older one; every delivery of them has ended, so none runs under it
    claims_earlier: tuple[str, ...] = ()

    def parked_claims(self) -> tuple[str, ...]:
        """The claims a grant to this execution may still be held under by a delivery that
        has ended (parked), newest first."""
        return (self.claim_before, *self.claims_earlier) if self.claim_before else ()

    def on_arrival(self, redelivered: bool, partition: str | None) -> WaitState:
        """This state, as a delivery arriving now sees it: the wait (for ``max_wait``) starts
        at the first attempt, a redelivery may have to take over its previous delivery's
        permit, and the partition is the execution's."""
        return replace(
            self,
            first_wait=self.first_wait or time.time(),
            takeover=self.takeover or redelivered,
            partition=partition,
        )

    @classmethod
    def from_request(cls, request: Any) -> WaitState:
        headers = getattr(request, "headers", None) or {}
        raw = headers.get(HEADER) if isinstance(headers, Mapping) else None
        if raw is None:
            raw = getattr(request, HEADER, None)
        return cls.from_headers(raw, request.retries or 0)

    @classmethod
    def from_headers(cls, raw: Any, retries: int) -> WaitState:
        """From the ``semaphore_wait`` header's value (``raw``) of an execution with
        ``retries``; a header from another attempt (the user's ``self.retry()`` copies
        headers) is void.  A malformed field raises :class:`SemaphoreRequestError` naming it
        (a message may carry anything: the task fails, the worker goes on)."""
        if not isinstance(raw, Mapping) or raw.get("r") != retries:
            return cls()
        first = raw.get("t0")
        partition = raw.get("p")
        before = raw.get("pc")
        earlier = raw.get("pe")
        return cls(
            epoch=_count(raw, "e"),
            waits=_count(raw, "n"),
            first_wait=None if first is None else _seconds(raw, "t0"),
            takeover=bool(raw.get("o")),
            partition=partition if isinstance(partition, str) else None,
            claim_before=before if isinstance(before, str) and before else None,
            claims_earlier=tuple(c for c in earlier[: CLAIM_CHAIN - 1] if isinstance(c, str) and c)
            if isinstance(earlier, list)
            else (),
        )

    def header(self, retries: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "r": retries,
            "e": self.epoch,
            "n": self.waits,
            "t0": self.first_wait,
            "o": 1 if self.takeover else 0,
        }
        if self.partition is not None:
            out["p"] = self.partition
        if self.claim_before is not None:
            out["pc"] = self.claim_before
        if self.claims_earlier:
            out["pe"] = list(self.claims_earlier)
        return out


def _malformed(field: str, value: Any, accepted: str) -> SemaphoreRequestError:
    return SemaphoreRequestError(
        f"the message's {HEADER!r} header is malformed: its field {field!r} is "
        f"{reprlib.repr(value)}; {accepted}"
    )


def _count(raw: Mapping[str, Any], field: str) -> int:
    value = raw.get(field, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _malformed(field, value, "it must be a whole number from 0")
    if not math.isfinite(value) or value < 0 or value != int(value) or value > MAX_COUNT:
        raise _malformed(field, value, f"it must be a whole number from 0 to {MAX_COUNT}")
    return int(value)


def _seconds(raw: Mapping[str, Any], field: str) -> float:
    value = raw.get(field)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and 0 <= value < MAX_SECONDS)
    ):
        raise _malformed(field, value, "it must be a Unix time in seconds")
    return float(value)


#: the largest count a ``semaphore_wait`` header may carry (epoch, waits)
MAX_COUNT = 2**53
#: a ``semaphore_wait`` header's times are Unix seconds below this (the year 5138)
MAX_SECONDS = 1e11


def copy_of_execution(state: WaitState) -> bool:
    """Is this delivery a copy of an execution that may have run already (a parked or woken
    copy, a redelivery)?  Only such a copy is dropped when it finds its ticket done (a
    tombstone).  A first delivery is a new request, even with a task id used before (an id
    reused for a later send, ``report-user-42``, runs again)."""
    return state.epoch > 0 or state.takeover


def stamp_wait(req: Any, state: WaitState) -> None:
    """Write the wait as the gate knows it (when it began, its partition) into the request it
    hands to the pool, so a body that waits on (in its slot, standing by, parked) counts
    ``max_wait`` from the task's first arrival, not from its hand-over."""
    retries = int(req.request_dict.get("retries") or 0)
    header = state.header(retries)
    req.request_dict[HEADER] = header
    headers = req.request_dict.get("headers")
    if isinstance(headers, dict) and HEADER in headers:
        headers[HEADER] = header
