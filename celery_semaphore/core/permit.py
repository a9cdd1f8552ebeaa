"""What an attempt gives back: its :class:`Attempt` (with an :class:`AttemptStatus`), and the
:class:`Permit` (or, for a group, the :class:`GroupPermit`) it grants."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from types import TracebackType
from typing import TYPE_CHECKING

from .info import ThrottleResult

if TYPE_CHECKING:
    from .group import SemaphoreGroup
    from .semaphore import Semaphore

__all__ = ["DEFAULT_TOMBSTONE_TTL", "Attempt", "AttemptStatus", "GroupPermit", "Permit"]

#: How long a released token is remembered, so a re-sent release reports success.
DEFAULT_TOMBSTONE_TTL = 10.0
_DEFAULT_TOMBSTONE_MS = max(1, int(DEFAULT_TOMBSTONE_TTL * 1000))  # as Semaphore._ms() gives it


class AttemptStatus(IntEnum):
    """The outcome of one :meth:`Semaphore.try_acquire` (the script's status codes)."""

    GRANTED = 1  #: a new permit
    ALREADY_HELD = 2  #: this ticket and claim already held a permit; same permit returned
    HELD_ELSEWHERE = 3  #: the ticket holds a permit under another claim
    DONE = 4  #: the ticket was released recently (a tombstone exists)
    WAITING = 5  #: not granted; the place in line is kept
    WEIGHT_OVER_LIMIT = 6  #: the weight exceeds the (possibly overridden) limit
    NOT_QUEUED = 7  #: not granted, and no place was kept (``place_ttl=0``)
    STALE = 8  #: the place belongs to a newer epoch of this ticket
    #: the ticket's place was taken by a newer waiter (``keep_newest``); no place now
    DROPPED = 9
    #: not granted, and its partition's line was full (``max_waiting``): no place was taken
    FULL = 10


STATUSES = {status.value: status for status in AttemptStatus}


@dataclass(frozen=True, init=False)
class Attempt:
    """The result of :meth:`Semaphore.try_acquire`."""

    status: AttemptStatus
    permit: Permit | None = None
    position: int | None = None  #: for WAITING: in its partition's line, 0 is the head
    epoch: int = 0  #: for WAITING and STALE: the epoch of the place
    limit: int = 0  #: the limit in force when the script ran
    #: for WAITING: seconds until every rate window has room for this waiter's weight and a
    #: throttle pause (:meth:`Semaphore.throttled`) is over (server clock), when either is in
    #: the way; None: neither is (or no rate and no pause).  Nobody releases when a window
    #: opens or a pause ends: a waiter at the head of its line retries by itself then.
    rate_retry_after: float | None = None

    def __init__(
        self,
        status: AttemptStatus,
        permit: Permit | None = None,
        position: int | None = None,
        epoch: int = 0,
        limit: int = 0,
        rate_retry_after: float | None = None,
    ) -> None:
        # the generated __init__ of a frozen dataclass sets each field through
        # object.__setattr__; this one is on every acquire's path, so fill __dict__ at once
        self.__dict__.update(
            status=status,
            permit=permit,
            position=position,
            epoch=epoch,
            limit=limit,
            rate_retry_after=rate_retry_after,
        )


class Permit:
    """A granted share of a semaphore: ``weight`` units, held under ``token``.

    ``fencing_token`` strictly increases per semaphore across grants; hand it to downstream
    systems so they can refuse a stale holder's writes.  A Permit is a context manager that
    releases on exit.
    """

    def __init__(
        self,
        semaphore: Semaphore,
        token: str,
        weight: int,
        fencing_token: int,
        lease_expires_at: float,
        claim: str = "",
    ) -> None:
        self.semaphore = semaphore
        self.token = token
        self.weight = weight
        self.fencing_token = fencing_token
        #: server epoch seconds at which the lease runs out, as of the last grant or refresh
        self.lease_expires_at = lease_expires_at
        self.claim = claim
        #: set when a refresh found the permit gone (its lease expired and was reclaimed)
        self.lost = False
        self._released = False
        self._lock = threading.Lock()

    @property
    def released(self) -> bool:
        return self._released

    def refresh(self, lease_ttl: float | None = None) -> bool:
        """Extend the lease by ``lease_ttl`` (default: the semaphore's) from now.

        Returns False, and sets :attr:`lost`, when the permit is no longer held.
        """
        if self._released:
            return False
        expiry = self.semaphore.refresh_token(
            self.token, lease_ttl=lease_ttl, holder_only=True, claim=self.claim
        )
        if expiry is None:
            self.lost = True
            return False
        self.lease_expires_at = expiry
        return True

    def release(self, *, tombstone_ttl: float | None = None) -> bool:
        """Give the units back.  Idempotent: only the first call talks to Redis.

        Returns True when this call released the permit, False when it was no longer held
        (lost to lease expiry, or already released).
        """
        with self._lock:
            if self._released:
                return False
            # A Redis failure raises SemaphoreBackendError and leaves the permit unreleased,
            # so the call can be retried (the release is idempotent per token).
            sem = self.semaphore
            token, claim = self.token, self.claim
            if tombstone_ttl is None and type(token) is str and token and type(claim) is str:
                # the usual case: token and claim were checked when the permit was granted
                result = sem._release(token, _DEFAULT_TOMBSTONE_MS, claim, True, True) in (1, 2)
            else:
                result = sem.release_token(
                    self.token, tombstone_ttl=tombstone_ttl, claim=self.claim
                )
            self._released = True
            return result

    def throttled(self, retry_after: float | None = None) -> ThrottleResult:
        """The call made under this permit was refused by the downstream service (429, 503):
        :meth:`Semaphore.throttled` with this permit's fencing token, so the episode rule is
        exact: a permit granted before the last decrease ran under the old limit, and its
        refusal lowers nothing more.  Callable after the release too."""
        return self.semaphore.throttled(retry_after, fencing_token=self.fencing_token)

    def __enter__(self) -> Permit:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return (
            f"<Permit {self.semaphore.name!r} token={self.token!r} weight={self.weight} "
            f"fencing_token={self.fencing_token}>"
        )


class GroupPermit(Permit):
    """A granted group: a permit in every member, under one token, released together.

    It is a :class:`~celery_semaphore.Permit` (its ``semaphore``, ``weight`` and
    ``fencing_token`` are the first member's); :attr:`permits` holds each member's own.
    Refresh and release it as a whole (a member's permit released on its own would leave the
    others held until their lease runs out).
    """

    def __init__(
        self,
        group: SemaphoreGroup,
        token: str,
        permits: Sequence[Permit],
        lease_expires_at: float,
        claim: str = "",
    ) -> None:
        first = permits[0]
        super().__init__(
            first.semaphore, token, first.weight, first.fencing_token, lease_expires_at, claim
        )
        self.group = group
        #: each member's permit, in the group's order
        self.permits: tuple[Permit, ...] = tuple(permits)

    def refresh(self, lease_ttl: float | None = None) -> bool:
        """Extend every member's lease; False (and ``lost``) when any is no longer held."""
        if self._released:
            return False
        expiry = self.group.refresh_token(
            self.token, lease_ttl=lease_ttl, holder_only=True, claim=self.claim
        )
        if expiry is None:
            self.lost = True
            return False
        self.lease_expires_at = expiry
        for permit in self.permits:
            permit.lease_expires_at = expiry
        return True

    def release(self, *, tombstone_ttl: float | None = None) -> bool:
        """Give back every member's units, in one script.  Idempotent; True when this call
        released the group (in at least one member)."""
        with self._lock:
            if self._released:
                return False
            result = self.group.release_token(
                self.token, tombstone_ttl=tombstone_ttl, claim=self.claim
            )
            self._released = True
            return result

    def throttled(self, retry_after: float | None = None) -> ThrottleResult:
        """Not for a group: which member's downstream refused the call is not known here.
        Call :meth:`~celery_semaphore.Permit.throttled` on that member's permit in
        :attr:`permits` instead."""
        raise TypeError(
            f"throttled() is not accepted on a GroupPermit ({', '.join(self.group.names)}): "
            "call it on the permit of the member whose downstream refused the call "
            "(group_permit.permits[i].throttled(...))"
        )

    def __enter__(self) -> GroupPermit:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        names = ", ".join(self.group.names)
        return f"<GroupPermit [{names}] token={self.token!r}>"
