"""What one attempt asks for: :class:`AcquireRequest`, and the checks of its values.

:meth:`Semaphore.try_acquire <celery_semaphore.Semaphore.try_acquire>` (and a group's) takes
these as keyword arguments, makes one request of them, checks it, and hands it down to the
script call (:func:`.wire.acquire_args`); the blocking wait makes one and sends it again on
every try.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, TypedDict

from . import _validate

__all__ = [
    "AcquireRequest",
    "AttemptOptions",
    "GroupAttemptOptions",
    "QueueOptions",
    "make_request",
]


class QueueOptions(TypedDict, total=False):
    """The place-in-line options ``acquire`` and ``hold`` take besides their named ones:
    which line (``partition``, ``partition_cap``, ``partition_weight``) and where in it
    (``priority``, ``max_waiting``, ``keep_newest``); see :meth:`Semaphore.try_acquire
    <celery_semaphore.Semaphore.try_acquire>`."""

    partition: str
    partition_cap: int | None
    partition_weight: int
    priority: int
    max_waiting: int | None
    keep_newest: bool


class PlaceOptions(TypedDict, total=False):
    """What one attempt of a semaphore or a group may say besides its ticket (see
    :meth:`Semaphore.try_acquire <celery_semaphore.Semaphore.try_acquire>`)."""

    owner: Mapping[str, Any] | None
    place_ttl: float
    claim: str
    wake_data: str
    wake_grace: float
    epoch: int
    check_done: bool
    new_execution: bool
    lease_ttl: float | None
    partition: str
    partition_weight: int


class AttemptOptions(PlaceOptions, total=False):
    """The keyword arguments of :meth:`Semaphore.try_acquire
    <celery_semaphore.Semaphore.try_acquire>`."""

    weight: int
    partition_cap: int | None
    ready: bool
    priority: int
    max_waiting: int | None
    keep_newest: bool


class GroupAttemptOptions(PlaceOptions, total=False):
    """The keyword arguments of :meth:`SemaphoreGroup.try_acquire
    <celery_semaphore.SemaphoreGroup.try_acquire>`."""

    partition_caps: Mapping[str, int | None] | None


class AcquireRequest(NamedTuple):
    """One attempt's arguments, as :meth:`Semaphore.try_acquire
    <celery_semaphore.Semaphore.try_acquire>` documents them (seconds, not ms).  Made by
    ``try_acquire``; its values are checked by the semaphore (or group) that sends it
    (:meth:`check_times`, and the checks that depend on the semaphore).

    Immutable; a named tuple rather than a frozen dataclass because one is made on every
    attempt, and a tuple is made several times faster."""

    ticket: str
    weight: int = 1
    owner: Mapping[str, Any] | None = None
    place_ttl: float = 0.0
    claim: str = ""
    wake_data: str = ""
    wake_grace: float = 1.0
    epoch: int = 0
    check_done: bool = False
    new_execution: bool = False
    lease_ttl: float | None = None  #: None: the semaphore's (a group's: its members' shortest)
    partition: str = ""
    partition_cap: int | None = None
    partition_weight: int = 1
    #: for a group: each member's cap for ``partition`` (None: no cap), in the group's order
    member_caps: tuple[int | None, ...] = ()
    #: False: take or keep the place in line, but never be granted while so (a single
    #: semaphore only; see ``Semaphore.try_acquire``)
    ready: bool = True
    #: 0-9, higher served earlier: a new place stands as if it came ``priority *
    #: priority_step`` seconds earlier (a kept place keeps its own)
    priority: int = 0
    #: a new place is taken only while fewer than this many wait in its partition's line
    #: (None: no bound); else FULL, or with ``keep_newest`` the front waiters are DROPPED
    max_waiting: int | None = None
    keep_newest: bool = False

    def check_times(self) -> None:
        """Check the values whose accepted range does not depend on the semaphore: times,
        claim, wake data and epoch (the first bad one raises)."""
        _validate.non_negative_seconds("place_ttl", self.place_ttl)
        _validate.optional_positive_seconds("lease_ttl", self.lease_ttl)
        _validate.non_negative_seconds("wake_grace", self.wake_grace)
        _validate.text("claim", self.claim)
        if _validate.text("wake_data", self.wake_data).startswith("~"):
            raise ValueError(
                f"wake_data={self.wake_data!r} is not accepted: wake data may not start with "
                "'~' (the line's mark of a waiter that is not ready); use any other text"
            )
        _validate.non_negative_int("epoch", self.epoch)
        if self.priority or self.max_waiting is not None or self.keep_newest:
            _validate.priority("priority", self.priority)
            _validate.optional_non_negative_int("max_waiting", self.max_waiting)
            _validate.flag("keep_newest", self.keep_newest)


_ATTEMPT_KEYS = frozenset(AttemptOptions.__optional_keys__)


def make_request(ticket: str, options: AttemptOptions) -> AcquireRequest:
    """The request of ``try_acquire(ticket, **options)`` (unchecked), refusing other names."""
    if not options.keys() <= _ATTEMPT_KEYS:
        unknown = sorted(set(options) - _ATTEMPT_KEYS)
        raise TypeError(
            f"try_acquire() got unexpected keyword argument(s) {', '.join(unknown)}; it takes "
            f"{', '.join(sorted(_ATTEMPT_KEYS))}"
        )
    return AcquireRequest(ticket, **options)


def check_queue(weight: int, options: QueueOptions) -> None:
    """Check :class:`QueueOptions` for a waiter of ``weight`` units (refusing other names)."""
    unknown = sorted(set(options) - set(QueueOptions.__annotations__))
    if unknown:
        raise TypeError(
            f"unexpected keyword argument(s) {', '.join(unknown)}: the place-in-line options "
            "are partition, partition_cap, partition_weight, priority, max_waiting and "
            "keep_newest"
        )
    check_partition(
        weight,
        options.get("partition", ""),
        options.get("partition_cap"),
        options.get("partition_weight", 1),
    )
    _validate.priority("priority", options.get("priority", 0))
    _validate.optional_non_negative_int("max_waiting", options.get("max_waiting"))
    _validate.flag("keep_newest", options.get("keep_newest", False))


def done_mode(check_done: bool, new_execution: bool) -> int:
    """The scripts' ``check_done`` number: 1 report a released ticket as done, 2 forget that
    it was (a new execution of it), 0 neither.  Refuses both at once."""
    if check_done and new_execution:
        raise ValueError(
            "check_done=True and new_execution=True are not accepted together: a call either "
            "continues an execution (check_done) or starts a new one (new_execution)"
        )
    return 1 if check_done else 2 if new_execution else 0


def check_partition(
    weight: int, partition: str, partition_cap: int | None, partition_weight: int
) -> None:
    """Check the partition arguments of a waiter of ``weight`` units."""
    if partition == "" and partition_cap is None and partition_weight == 1:
        return  # the usual case, checked at a glance
    part = _validate.partition("partition", partition)
    cap = _validate.optional_positive_int("partition_cap", partition_cap)
    _validate.positive_int(
        "partition_weight", partition_weight, maximum=_validate.MAX_PARTITION_WEIGHT
    )
    if cap is not None and weight > cap:
        raise ValueError(
            f"weight={weight} is not accepted with partition_cap={cap} (partition "
            f"{part!r}): a waiter heavier than its partition's cap could never be granted; "
            f"use a weight from 1 to {cap} or a larger partition_cap"
        )
