"""The one place where Redis key names are built.

Every key of one semaphore looks like ``<prefix>:{<tag>}:<part>``.  The ``{<tag>}`` hash tag puts
all of them in one Redis Cluster slot, so each script can touch them atomically.

``<tag>`` encodes the semaphore name so that distinct names can never share or escape keys:

* characters outside ``[A-Za-z0-9_.-]`` (braces, ``:``, spaces, unicode, ``%`` and ``~``) are
  percent-encoded from UTF-8, so the tag never contains ``{`` or ``}`` and the first ``}`` in the
  key always closes it;
* an encoding longer than :data:`MAX_READABLE` keeps a readable head and ends in ``~`` plus the
  SHA-256 of the name; ``~`` never appears in a plain encoding, so the two forms cannot meet.

The prefix may not contain braces (checked by :func:`validate_prefix`), so the hash tag is always
the tag above.

With a ``hash_tag`` (several semaphores that must share one Redis Cluster slot, for
:class:`~celery_semaphore.SemaphoreGroup`), the keys look like
``<prefix>:{<encoded hash_tag>}:n:<encoded name>:<part>``: the tag is the encoded hash tag, and
the encoded name follows a fixed ``n:`` marker.  Encoded names and tags contain no ``:``, so a
key still names exactly one (hash_tag, name) pair, and it can never equal a key of a semaphore
without a hash tag (those continue ``}:state``, ``}:expiry``, ``}:line``, ``}:starts`` or
``}:wake:``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import quote

__all__ = [
    "MAX_READABLE",
    "SemaphoreKeys",
    "encode_name",
    "validate_prefix",
]

MAX_READABLE = 200
_SAFE = "-_."  # with ASCII letters and digits, which quote() always leaves alone


def encode_name(name: str) -> str:
    """Return the brace-free, injective hash-tag text for ``name``."""
    # quote() never encodes "~" (an RFC 3986 unreserved character), so encode it by hand: the
    # hashed form below relies on "~" never appearing in a plain encoding.
    plain = quote(name, safe=_SAFE, encoding="utf-8", errors="strict").replace("~", "%7E")
    if len(plain) <= MAX_READABLE:
        return plain
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()
    return f"{plain[:64]}~{digest}"


def validate_prefix(key_prefix: object) -> str:
    if not isinstance(key_prefix, str):
        raise TypeError(f"key_prefix must be a str, got {type(key_prefix).__name__} {key_prefix!r}")
    if not key_prefix or "{" in key_prefix or "}" in key_prefix:
        raise ValueError(
            f"key_prefix={key_prefix!r} is not accepted: use a non-empty string without "
            "'{' or '}' (braces would change the Redis Cluster hash tag)"
        )
    return key_prefix


@dataclass(frozen=True)
class SemaphoreKeys:
    """The keys of one semaphore; :meth:`state_keys` lists them in the order the Lua scripts
    expect (KEYS[1..4]; ``scripts/_lib.lua`` describes what each holds)."""

    expiry: str  # ZSET "h:"/"w:"/"d:" + token -> lease / place / tombstone expiry (server ms)
    state: str  # HASH used, seq, fence, limit_override; "h:"/"w:" + token -> holder / waiter
    line: str  # ZSET ticket -> arrival sequence number (FIFO order)
    base: str  # "<prefix>:{<tag>}", to derive per-ticket wake keys
    #: ZSET, only while a rate is set: one member per start, scored by its server ms
    starts: str = ""

    #: the Redis type each of :meth:`state_keys` must hold (or be absent)
    TYPES: ClassVar[tuple[str, ...]] = ("zset", "hash", "zset", "zset")

    @classmethod
    def for_name(cls, name: str, key_prefix: str, hash_tag: str | None = None) -> SemaphoreKeys:
        if hash_tag is None:
            base = f"{key_prefix}:{{{encode_name(name)}}}"
        else:
            base = f"{key_prefix}:{{{encode_name(hash_tag)}}}:n:{encode_name(name)}"
        return cls(
            expiry=f"{base}:expiry",
            state=f"{base}:state",
            line=f"{base}:line",
            base=base,
            starts=f"{base}:starts",
        )

    def state_keys(self) -> list[str]:
        """KEYS[1..4] for every script (the group scripts: four per member)."""
        return [self.expiry, self.state, self.line, self.starts]

    def wake(self, ticket: str) -> str:
        """The list a blocked waiter with ``ticket`` waits on (BLPOP)."""
        return f"{self.base}:wake:{quote(ticket, safe=_SAFE)}"

    def gone(self, token: str) -> str:
        """Why the permit ``token`` was released by someone other than its holder (a STRING
        with a short TTL, read by the holder's heartbeat when it finds the permit gone)."""
        return f"{self.base}:gone:{quote(token, safe=_SAFE)}"
