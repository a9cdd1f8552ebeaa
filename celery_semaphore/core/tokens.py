"""The token calls of a :class:`~celery_semaphore.Semaphore`: release, refresh and withdraw a
permit or a place by its token (part of the low-level API, for integrations)."""

from __future__ import annotations

from . import _validate, wire
from .base import GONE_TTL
from .controls import SemaphoreControls
from .permit import DEFAULT_TOMBSTONE_TTL

__all__ = ["SemaphoreTokens"]


class SemaphoreTokens(SemaphoreControls):
    """Release, refresh and withdraw by token (part of :class:`~celery_semaphore.Semaphore`)."""

    def release_token(
        self,
        token: str,
        *,
        tombstone_ttl: float | None = None,
        claim: str = "",
        timed: bool = True,
        handoff: bool = True,
        reason: str = "",
        only_now: bool = False,
    ) -> bool:
        """Release the permit held under ``token``.  True if it was held (or this very release
        was already applied by a re-sent call); False if it was not held.  ``only_now``: True
        only when this call released it, not when it was released already (its tombstone is
        there: the holder released it, or a re-sent call did).  With ``claim``,
        only a permit granted under that claim is released.  ``tombstone_ttl=0`` leaves no
        tombstone (the token may be acquired again at once).  ``timed=False``: the hold ended
        no finished work (a forced release, a grant given back unused), so it does not count
        in :attr:`Snapshot.hold_time_avg`.  ``handoff=False``: grant nothing by handoff (see
        ``on_handoff``), only name the waiters.  ``reason``: why someone other than the
        holder releases it (e.g. "forced by alice@ops-1"); kept for
        :data:`~celery_semaphore.core.semaphore.GONE_TTL` seconds, for the holder to read
        with :meth:`release_reason`."""
        token = _validate.ticket("token", token)
        claim = _validate.text("claim", claim)
        tomb = _validate.optional_non_negative_seconds("tombstone_ttl", tombstone_ttl)
        if reason:
            # written first: a holder that finds its permit gone finds the reason with it
            key = self.keys.gone(token)
            self._call(lambda: self.client.set(key, reason, px=int(GONE_TTL * 1000)))
        tomb_ms = self._ms(DEFAULT_TOMBSTONE_TTL) if tomb is None else int(tomb * 1000)
        status = self._release(token, tomb_ms, claim, timed, handoff)
        return status == 1 if only_now else status in (1, 2)

    def _release(self, token: str, tomb_ms: int, claim: str, timed: bool, handoff: bool) -> int:
        """:meth:`release_token` with its arguments checked, the tombstone time in ms."""
        handler = self.on_handoff if handoff else None
        handoff_ms = self._ms(self.lease_ttl) if handler is not None else 0
        args = wire.release_args(
            token, self.limit, tomb_ms, self._aging_ms, timed, handoff_ms, claim
        )
        status, handed, wakes = wire.release_reply(self._run("release", args), handler is not None)
        if handler is not None:
            for handoff_made in handed:
                self._handed(handler, handoff_made)
        self._wake(wakes)
        return status

    def refresh_token(
        self,
        token: str,
        *,
        lease_ttl: float | None = None,
        place_ttl: float | None = None,
        holder_only: bool = False,
        claim: str = "",
    ) -> float | None:
        """Extend a holder's lease (or a waiter's place) from now.

        Returns the new expiry in server epoch seconds, or None when the token is neither
        holding nor waiting (with ``holder_only``: not holding).  With ``claim``, only a
        permit granted under that claim is extended: one held under another claim (another
        copy of the ticket) is left alone and reported as not held (None).
        """
        token = _validate.ticket("token", token)
        token = _validate.ticket("token", token)
        claim = _validate.text("claim", claim)
        lease = _validate.optional_positive_seconds("lease_ttl", lease_ttl)
        place = _validate.optional_positive_seconds("place_ttl", place_ttl)
        lease_ms, place_ms = self._ms(lease or self.lease_ttl), self._ms(place or self.lease_ttl)
        args = wire.refresh_args(token, lease_ms, place_ms, self.limit, self._aging_ms, claim)
        status, expiry, wakes = wire.refresh_reply(self._run("refresh", args))
        self._wake(wakes)
        if status in (0, 3) or (holder_only and status != 1):
            return None
        return expiry

    def withdraw(self, ticket: str, *, wake: bool = False) -> bool:
        """Give up a place in line.  True if there was one.  ``wake=True`` (someone else
        withdraws it, e.g. an operator's reset) also wakes the waiter itself, as a release
        would, so it finds out at once that its place is gone and asks again; a parked one is
        woken only through ``on_wake``."""
        ticket = _validate.ticket("ticket", ticket)
        ticket = _validate.ticket("ticket", ticket)
        args = wire.withdraw_args(ticket, self.limit, self._aging_ms, wake)
        status, wakes = wire.status_reply(self._run("withdraw", args))
        self._wake(wakes)
        return status == 1
