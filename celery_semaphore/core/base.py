"""The configuration of a :class:`~celery_semaphore.Semaphore` and its plumbing: the Redis
client, the script calls and their errors, and the wake-ups a script asks for."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis as redis_lib
from redis.exceptions import RedisError, ResponseError

from .. import logs
from . import _validate, connection, liveness, wire
from ._scripts import ScriptSet
from .exceptions import SemaphoreBackendError, SemaphoreError, SemaphoreStateError
from .keys import SemaphoreKeys, validate_prefix
from .rates import Rate, encode_rates, parse_rates

__all__ = ["GONE_TTL", "HANDOFF_MARK", "HandoffHandler", "SemaphoreBase", "WakeHandler"]

log = logs.get("semaphore")

DEFAULT_URL = "redis://localhost:6379/0"
#: A blocked waiter re-checks at least this often, in case a wake-up was lost.
DEFAULT_POLL_INTERVAL = 1.0
#: A head waiter that does not fit in the free units reserves them once it has waited this long.
DEFAULT_AGING = 2.0
#: Seconds one step of priority moves a waiter forward in its line.
DEFAULT_PRIORITY_STEP = 60.0

WakeHandler = Callable[[str, str], None]
#: ``on_handoff(ticket, data, fencing_token, lease_expires_at, claim)``: see :class:`Semaphore`
HandoffHandler = Callable[[str, str, int, float, str], None]
#: seconds a forced release's reason stays readable
#: (:meth:`~celery_semaphore.Semaphore.release_reason`)
GONE_TTL = 600.0

#: Wake data ending with this marks a parked waiter that takes *handoffs*: a release (by a
#: Semaphore with ``on_handoff``) grants it the units it frees for it, under the claim its
#: owner metadata names (``owner["claim"]``, a non-empty string; the same claim it waits
#: with), rather than naming it to come and claim them.
HANDOFF_MARK = "#handoff"
_T = TypeVar("_T")


class SemaphoreBase:
    """What every :class:`~celery_semaphore.Semaphore` call stands on (see its parameters)."""

    def __init__(
        self,
        name: str,
        limit: int,
        *,
        redis: redis_lib.Redis | redis_lib.RedisCluster | str | None = None,
        lease_ttl: float = 60.0,
        key_prefix: str = "celery_semaphore",
        timeout: float | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        on_wake: WakeHandler | None = None,
        aging: float = DEFAULT_AGING,
        hash_tag: str | None = None,
        on_handoff: HandoffHandler | None = None,
        rate: str | Rate | Sequence[str | Rate] | None = None,
        adaptive: bool = False,
        priority_step: float = DEFAULT_PRIORITY_STEP,
        liveness_ttl: float | None = None,
    ) -> None:
        self.name = _validate.name("name", name)
        #: whether :meth:`throttled` lowers the limit (see the ``adaptive`` parameter)
        self.adaptive = _validate.flag("adaptive", adaptive)
        self.limit = _validate.positive_int("limit", limit)
        #: the rate windows, by period (empty: no rate)
        self.rates: tuple[Rate, ...] = parse_rates("rate", rate)
        self._rate_text = encode_rates(self.rates)
        #: the most weight one start may have under the rate (a window's smallest count)
        self._rate_max_weight = min((r.count for r in self.rates), default=None)
        self.lease_ttl = _validate.positive_seconds("lease_ttl", lease_ttl)
        self.key_prefix = validate_prefix(key_prefix)
        self.timeout = _validate.optional_non_negative_seconds("timeout", timeout)
        self.poll_interval = _validate.positive_seconds("poll_interval", poll_interval)
        self.on_wake = on_wake
        self.on_handoff = on_handoff if on_wake is not None else None
        self.aging = _validate.non_negative_seconds("aging", aging)
        self._aging_ms = int(self.aging * 1000)
        # at most MAX_SECONDS: 9 steps in ms then stay below the line's 10**13 ms of headroom
        self.priority_step = _validate.non_negative_seconds("priority_step", priority_step)
        self._step_ms = int(self.priority_step * 1000)
        self.hash_tag = None if hash_tag is None else _validate.name("hash_tag", hash_tag)
        self.keys = SemaphoreKeys.for_name(self.name, self.key_prefix, self.hash_tag)
        #: seconds a process's liveness record lives unrefreshed (None: off)
        self.liveness_ttl = _validate.optional_non_negative_seconds("liveness_ttl", liveness_ttl)
        if isinstance(redis, str):
            self._url: str | None = _validate.redis_url("redis", redis)
            self._client: Any = None
        elif redis is None:
            self._url, self._client = DEFAULT_URL, None
        elif hasattr(redis, "register_script"):
            self._url, self._client = None, redis
        else:
            raise TypeError(
                "redis must be a redis.Redis or redis.RedisCluster client, a redis://, "
                f"rediss:// or unix:// URL, or None; got {type(redis).__name__} {redis!r}"
            )
        self._scripts: ScriptSet | None = None
        self._key_args: tuple[bytes, ...] = ()
        self._init_lock = threading.Lock()
        self._local = threading.local()

    #: acquire.lua's liveness argument ("<ttl ms> <ident>"; "": off, or a Redis Cluster)
    _live_arg = ""

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The redis-py client (created on first use when a URL was given)."""
        if self._client is None:
            with self._init_lock:
                if self._client is None:
                    self._client = connection.redis_client(self._url or DEFAULT_URL)
        return self._client

    def _run(
        self, operation: str, args: list[Any], key_args: tuple[bytes, ...] | None = None
    ) -> list[Any]:
        scripts = self._scripts
        if scripts is None:
            scripts = self._load_scripts()
        # last ARGV of every script: can this caller wake parked waiters? (see _lib.lua)
        dispatch = b"1" if self.on_wake is not None else b"0"
        keys = self._key_args if key_args is None else key_args
        try:
            reply: list[Any] = scripts.run(operation, keys, args, dispatch)
        except RedisError as exc:
            raise self._error(exc) from exc
        return reply

    def _load_scripts(self) -> ScriptSet:
        client = self.client  # outside the lock: `client` takes the same (non-reentrant) lock
        with self._init_lock:
            if self._scripts is None:
                scripts = ScriptSet(client)
                keys = self.keys.state_keys()
                if self.liveness_ttl and not isinstance(client, redis_lib.RedisCluster):
                    procs = liveness.procs_key(self.key_prefix)
                    liveness.register(scripts, client, procs, self.liveness_ttl)
                    keys.append(procs)
                    self._live_arg = f"{int(self.liveness_ttl * 1000)} {liveness.ident()}"
                self._key_args = scripts.key_args(keys)
                self._scripts = scripts
            return self._scripts

    def _read_keys(self) -> tuple[bytes, ...]:
        """The keys of a read (inspect.lua): the semaphore's, and the key prefix's liveness
        records whether or not this object's liveness is on (not on a Redis Cluster)."""
        scripts = self._scripts or self._load_scripts()
        if len(self._key_args) > 5 or isinstance(self.client, redis_lib.RedisCluster):
            return self._key_args  # (numkeys + 5 keys: the records are in already)
        return scripts.key_args([*self.keys.state_keys(), liveness.procs_key(self.key_prefix)])

    def _call(self, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except RedisError as exc:
            raise self._error(exc) from exc

    def _error(self, exc: RedisError) -> SemaphoreError:
        """The SemaphoreError for a redis-py error of one of our calls."""
        if not isinstance(exc, ResponseError):
            return SemaphoreBackendError(
                f"semaphore {self.name!r}: Redis at {self._where()} failed: "
                f"{type(exc).__name__}: {exc}",
                name=self.name,
            )
        if "WRONGTYPE" in str(exc):
            # A key holds another type than ours.  The scripts read every key before their
            # first write, so the command failed before changing anything; find the key.
            state_error = self._state_error()
            if state_error is not None:
                return state_error
        return SemaphoreBackendError(
            f"semaphore {self.name!r}: Redis refused the command: {exc}", name=self.name
        )

    def _where(self) -> str:
        """Where the client points, without a password (for error messages)."""
        if self._url is not None:
            return connection.safe_url(self._url)
        return connection.describe_client(self._client)

    def _state_error(self) -> SemaphoreStateError | None:
        """A SemaphoreStateError naming the first of our keys that holds a foreign type, or
        None when none does (any more) or Redis cannot tell."""
        keys = self.keys.state_keys()
        try:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.type(key)
            found = [wire.text(t) for t in pipe.execute()]
        except RedisError:
            return None
        for key, kind, expected in zip(keys, found, SemaphoreKeys.TYPES, strict=True):
            if kind not in ("none", expected):
                return SemaphoreStateError(
                    f"semaphore {self.name!r}: key {key!r} holds a {kind}, expected a {expected}; "
                    "something other than celery-semaphore wrote it. Nothing was changed: "
                    "remove or rename that key (or use another key_prefix).",
                    name=self.name,
                    key=key,
                )
        return None

    def _lapsed(self, count: int) -> None:
        """An acquire of this object took back ``count`` holders whose lease had expired: say
        so (the script that takes one back runs once, so this is said once, by its caller)."""
        log.warning(
            "reclaimed %d permit(s) whose lease expired: a holder stopped refreshing (its "
            "process crashed or stalled past lease_ttl); taken back by an acquire",
            count,
            semaphore=self.name,
            task_id=None,
        )

    def _wake(self, items: list[Any]) -> None:
        """Wake the waiters a script named (its wake items, see :mod:`.wire`)."""
        if items:
            self._wake_pairs(wire.wake_pairs(items))

    def _wake_pairs(self, pairs: list[tuple[str, str]]) -> None:
        """Wake these (ticket, wake data) waiters: push to blocked ones' lists, hand parked
        ones' data to ``on_wake``.  Best effort: a lost wake-up costs one poll interval."""
        blocked: list[str] = []
        for ticket, data in pairs:
            if data:
                if self.on_wake is not None:
                    try:
                        self.on_wake(ticket, data)
                    except Exception:
                        log.exception(
                            "on_wake failed for %s", ticket, semaphore=self.name, task_id=None
                        )
            else:
                blocked.append(ticket)
        if not blocked:
            return
        ttl = max(1, int(self._blocking_place_ttl()))
        try:
            pipe = self.client.pipeline(transaction=False)
            for ticket in blocked:
                key = self.keys.wake(ticket)
                pipe.lpush(key, 1)
                pipe.expire(key, ttl)
            pipe.execute()
        except RedisError as exc:
            log.warning(
                "wake-up failed (%s); waiters will poll", exc, semaphore=self.name, task_id=None
            )

    def _handed(self, handler: HandoffHandler, handoff: wire.Handoff) -> None:
        """Tell ``handler`` of one handoff a release made."""
        ticket = handoff[0]
        try:
            handler(*handoff)
        except Exception:
            # the grant comes back when its lease expires (the receiver never had it)
            log.exception(
                "on_handoff failed for %s; its grant comes back with its lease",
                ticket,
                semaphore=self.name,
                task_id=None,
            )

    def _blocking_place_ttl(self) -> float:
        return max(2.0, 3 * self.poll_interval)

    def _ms(self, seconds: float) -> int:
        return max(1, int(seconds * 1000))

    @staticmethod
    def new_ticket() -> str:
        """A fresh, unique ticket for :meth:`try_acquire` or ``acquire(ticket=...)``."""
        # what uuid.uuid4().hex returns (122 random bits, version 4, RFC 4122 variant), built
        # without a UUID object, which costs several times more than the randomness
        raw = bytearray(os.urandom(16))
        raw[6] = (raw[6] & 0x0F) | 0x40
        raw[8] = (raw[8] & 0x3F) | 0x80
        return raw.hex()

    def _check_rate_weight(self, weight: int) -> None:
        most = self._rate_max_weight
        if most is not None and weight > most:
            raise ValueError(
                f"weight={weight} is not accepted for semaphore {self.name!r} with "
                f"rate={[str(r) for r in self.rates]}: a start counts its weight against every "
                f"window, and a window admits at most {most}; use a weight from 1 to {most} "
                "or a larger rate count"
            )
