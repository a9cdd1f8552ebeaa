"""The items on a worker gate's wake list, each tagged with its kind.

A release in another process tells a gate about the tasks it holds by pushing items onto the
gate's wake list in Redis.  Two kinds of item travel there, and a task id (which any sender
chooses) must never be read as the other kind, so every item starts with a tag written here,
never by a user:

* ``w <ticket>``: units were freed for ``ticket``: the gate claims them itself;
* ``h <fence> <expiry ms> <claim> <ticket>``: a release *granted* ``ticket`` its units (a
  handoff) under ``claim``, which only the waiting delivery and the release script know.  The
  gate trusts it only when the claim is the one of the delivery it holds.

Anything else (the empty item that ends the gate's blocking pop at stop, an item from an
older version) is not an item: :func:`parse` returns None.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Handoff", "Wake", "handoff_item", "parse", "wake_item"]


@dataclass(frozen=True)
class Wake:
    """Units were freed for ``ticket``."""

    ticket: str


@dataclass(frozen=True)
class Handoff:
    """A release granted ``ticket`` its units under ``claim``."""

    ticket: str
    fence: int
    expires_at: float  #: server epoch seconds
    claim: str


def wake_item(ticket: str) -> str:
    return f"w {ticket}"


def handoff_item(ticket: str, fence: int, expires_at: float, claim: str) -> str:
    # the claim is a hex string (no spaces), so the ticket is everything after it
    return f"h {fence} {round(expires_at * 1000)} {claim} {ticket}"


def parse(item: str) -> Wake | Handoff | None:
    """The item ``item`` read back, or None when it is not one."""
    kind, _, rest = item.partition(" ")
    if kind == "w" and rest:
        return Wake(rest)
    if kind == "h":
        parts = rest.split(" ", 3)
        if len(parts) == 4 and parts[0].isdigit() and parts[1].isdigit() and parts[2]:
            fence, expiry_ms, claim, ticket = parts
            return Handoff(ticket, int(fence), int(expiry_ms) / 1000, claim)
    return None
