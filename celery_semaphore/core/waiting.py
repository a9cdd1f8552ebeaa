"""The blocking wait of :meth:`Semaphore.wait <celery_semaphore.Semaphore.wait>` and
:meth:`SemaphoreGroup.wait <celery_semaphore.SemaphoreGroup.wait>` (and so of both
``acquire``): try, block on the ticket's wake list(s) until woken or the next poll, try again;
and clean up when the wait ends without a grant."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import redis as redis_lib
from redis.exceptions import RedisError

from .. import logs
from . import clock
from .exceptions import SemaphoreBackendError, SemaphoreError
from .permit import Attempt, AttemptStatus

log = logs.get("semaphore")


class Waitable(Protocol):
    """A semaphore or a group, as a wait cleans up after itself."""

    @property
    def client(self) -> Any: ...

    def withdraw(self, ticket: str) -> bool: ...

    def refresh_token(
        self, token: str, *, place_ttl: float | None = None, claim: str = ""
    ) -> float | None: ...


@dataclass(frozen=True)
class Waiter:
    """What a wait of one ticket needs to know of what it waits on."""

    target: Waitable
    #: one attempt: ``try_acquire(ticket, place_ttl=..., **options)``
    attempt: Callable[..., Attempt]
    #: the ticket's wake lists (one per semaphore); a release pushes onto them
    wake_keys: list[str]
    #: seconds between tries when no wake-up comes
    poll: float
    #: for errors: what waits (e.g. "semaphore 'x'") and the name they carry
    what: str
    name: str
    #: for the log: the semaphore's name ("a+b" for a group)
    log_name: str


def wait(
    waiter: Waiter,
    ticket: str,
    *,
    timeout: float | None,
    place_ttl: float,
    keep_place: float | None,
    give_up: Callable[[], bool] | None,
    check_every: float,
    options: Mapping[str, Any],
) -> Attempt:
    """See :meth:`Semaphore.wait <celery_semaphore.Semaphore.wait>` (``ticket`` checked)."""
    deadline = None if timeout is None else clock.monotonic() + timeout
    attempt: Attempt | None = None
    blocked = False
    try:
        while True:
            attempt = waiter.attempt(ticket, place_ttl=place_ttl, **options)
            if attempt.status is not AttemptStatus.WAITING:
                return attempt
            next_poll = clock.monotonic() + waiter.poll
            retry = attempt.rate_retry_after
            if retry is not None and attempt.position == 0:
                # the head waits for a rate window: nobody releases when it opens, so it
                # wakes by itself then (those behind it are named when it starts)
                next_poll = min(next_poll, clock.monotonic() + retry)
            if deadline is not None:
                next_poll = min(next_poll, deadline)
            while True:  # block until woken, the next poll, or give_up()
                remaining = next_poll - clock.monotonic()
                if remaining <= 0:
                    break
                blocked = True
                step = remaining if give_up is None else min(check_every, remaining)
                if _block(waiter, step):
                    break
                if give_up is not None and give_up():
                    return attempt
            if deadline is not None and clock.monotonic() >= deadline:
                return attempt
    finally:
        waiting = attempt is None or attempt.status is AttemptStatus.WAITING
        claim = str(options.get("claim", ""))
        _leave(waiter, ticket, waiting, blocked, claim, keep_place)


def _block(waiter: Waiter, seconds: float) -> bool:
    """Block on the wake lists; True when woken, False when the time ran out."""
    try:
        client = waiter.target.client
        return client.blpop(waiter.wake_keys, timeout=max(0.01, seconds)) is not None
    except redis_lib.exceptions.TimeoutError:
        return False  # the socket timeout is shorter than the block: just try again
    except RedisError as exc:
        raise SemaphoreBackendError(
            f"{waiter.what}: Redis failed while waiting: {exc}", name=waiter.name
        ) from exc


def _leave(
    waiter: Waiter,
    ticket: str,
    waiting: bool,
    blocked: bool,
    claim: str,
    keep_place: float | None,
) -> None:
    """After the wait, when still ``waiting``: withdraw the place, or with ``keep_place``
    restore its lifetime; then drop the wake lists when it blocked on them."""
    target = waiter.target
    try:
        if waiting and keep_place is None:
            target.withdraw(ticket)
        elif waiting and keep_place is not None:
            # the caller keeps its place with its own ticket: restore the place's lifetime
            # (under its claim: a grant another copy holds meanwhile is not extended)
            target.refresh_token(ticket, place_ttl=max(0.001, keep_place), claim=claim)
        if blocked:
            target.client.delete(*waiter.wake_keys)
    except (RedisError, SemaphoreError) as exc:
        # best effort: never let a cleanup failure replace the exception (or result) of
        # the wait itself
        log.warning(
            "cleanup after waiting failed: %s", exc, semaphore=waiter.log_name, task_id=None
        )
