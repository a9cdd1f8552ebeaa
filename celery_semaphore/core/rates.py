"""Rate windows: ``rate="100/s"`` or ``rate=["60/m", "1000/h"]`` or ``rate=Rate(100, 1.0)``.

A rate window ``N/period`` admits at most ``N`` starts (grants) in any ``period``; with several
windows a start needs room in every one.  A *spaced* window (``"5/s spaced"``,
``Rate(5, 1.0, spaced=True)``) also spaces the starts evenly, ``period / N`` apart, instead of
letting ``N`` start at once.  The windows are checked in the same Lua script as the units (see
"Rates" in docs/concepts.md), so this module only parses and checks what the user wrote and
encodes it for the scripts::

    >>> [str(r) for r in parse_rates("rate", ["1000/h", "60/m"])]
    ['60/m', '1000/h']
    >>> parse_rates("rate", "5/s spaced")
    (Rate(count=5, period_seconds=1.0, spaced=True),)
    >>> encode_rates(parse_rates("rate", "10/s"))
    '10 1000'
    >>> encode_rates(parse_rates("rate", "10/s spaced"))
    '10 1000s'
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from . import _validate

__all__ = ["MAX_WINDOWS", "Rate", "encode_rates", "parse_rates"]

#: seconds per period letter
PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: the slowest rate accepted: one start per day
MIN_PER_SECOND = 1 / 86400
#: the most windows one semaphore may have
MAX_WINDOWS = 8

_TEXT = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([smhd])(?:\s+(spaced))?\s*$")
_ACCEPTED = (
    'use "N/period" with N an int >= 1 and period s, m, h or d, optionally with a multiple '
    'and " spaced" (e.g. "100/s", "60/m", "5/10s", "5/s spaced"), a Rate(count, '
    "period_seconds, spaced=False), or a list of them"
)


@dataclass(frozen=True, repr=False)
class Rate:
    """At most ``count`` starts in any ``period_seconds`` (a sliding window); ``spaced``: the
    starts are also spaced evenly, :attr:`interval` apart (a start of weight ``w``, ``w``
    intervals), instead of coming in bursts of ``count``."""

    count: int
    period_seconds: float
    spaced: bool = False

    def __post_init__(self) -> None:
        _check(self.count, self.period_seconds, repr(self))
        if not isinstance(self.spaced, bool):
            raise TypeError(
                f"rate={self!r} is not accepted: spaced must be True or False, got "
                f"{type(self.spaced).__name__} {self.spaced!r}"
            )

    def __repr__(self) -> str:
        # spaced=False, the usual case, is left out (as the repr was before spacing existed)
        spaced = "" if self.spaced is False else f", spaced={self.spaced!r}"
        return f"Rate(count={self.count!r}, period_seconds={self.period_seconds!r}{spaced})"

    @property
    def period_ms(self) -> int:
        return round(self.period_seconds * 1000)

    @property
    def interval(self) -> float:
        """Seconds between two starts when spaced: ``period_seconds / count``."""
        return self.period_seconds / self.count

    def __str__(self) -> str:
        seconds = self.period_seconds
        spaced = " spaced" if self.spaced else ""
        for letter, size in reversed(PERIODS.items()):
            if seconds % size == 0:
                multiple = int(seconds // size)
                return f"{self.count}/{'' if multiple == 1 else multiple}{letter}{spaced}"
        return f"{self.count}/{seconds:g}s{spaced}"


def _check(count: object, period: object, shown: str, param: str = "rate") -> None:
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(
            f"{param}={shown} is not accepted: the count must be an int >= 1, got "
            f"{type(count).__name__} {count!r}"
        )
    if count < 1 or count > _validate.MAX_UNITS:
        raise ValueError(
            f"{param}={shown} is not accepted: the count must be an int from 1 to 2**52; "
            f"{_ACCEPTED}"
        )
    if isinstance(period, bool) or not isinstance(period, (int, float)):
        raise TypeError(
            f"{param}={shown} is not accepted: the period must be a number of seconds, got "
            f"{type(period).__name__} {period!r}"
        )
    if not math.isfinite(period) or period < 0.001:
        raise ValueError(
            f"{param}={shown} is not accepted: the period must be a finite number of seconds "
            f">= 0.001 (1 ms); {_ACCEPTED}"
        )
    if period > _validate.MAX_SECONDS:
        raise ValueError(
            f"{param}={shown} is not accepted: the period must be at most "
            f"{_validate.MAX_SECONDS:.0f} seconds (about 31 years)"
        )
    if count / period < MIN_PER_SECOND:
        raise ValueError(
            f"{param}={shown} is not accepted: it is below one start per day; use a rate of at "
            "least 1/d"
        )


def _one(param: str, value: object) -> Rate:
    if isinstance(value, Rate):
        return value
    if isinstance(value, str):
        match = _TEXT.match(value)
        if match is None:
            raise ValueError(f"{param}={value!r} is not accepted: {_ACCEPTED}")
        count, multiple, letter, spaced = match.groups()
        if multiple and int(multiple) < 1:
            raise ValueError(
                f"{param}={value!r} is not accepted: the period's multiple must be >= 1; "
                f"{_ACCEPTED}"
            )
        period = (int(multiple) if multiple else 1) * PERIODS[letter]
        _check(int(count), float(period), repr(value), param)
        return Rate(int(count), float(period), spaced=spaced is not None)
    raise TypeError(f"{param}={value!r} ({type(value).__name__}) is not accepted: {_ACCEPTED}")


def parse_rates(param: str, value: object) -> tuple[Rate, ...]:
    """The windows of ``value`` (one ``"N/period"`` string or :class:`Rate`, or an iterable of
    them), sorted by period; ``()`` for None.  Raises ``TypeError``/``ValueError`` naming
    ``param``, the value and what is accepted."""
    if value is None:
        return ()
    if isinstance(value, (str, Rate)):
        items: list[object] = [value]
    elif isinstance(value, Iterable) and not isinstance(value, (bytes, dict)):
        items = list(value)
        if not items:
            raise ValueError(f"{param}={value!r} is not accepted: {_ACCEPTED} (or None)")
    else:
        raise TypeError(f"{param}={value!r} ({type(value).__name__}) is not accepted: {_ACCEPTED}")
    if len(items) > MAX_WINDOWS:
        raise ValueError(
            f"{param}={value!r} is not accepted: use at most {MAX_WINDOWS} windows "
            f"(got {len(items)})"
        )
    rates = [_one(param, item) for item in items]
    return tuple(sorted(rates, key=lambda r: (r.period_ms, r.count, r.spaced)))


def encode_rates(rates: tuple[Rate, ...]) -> str:
    """The scripts' rate text: ``"<count> <period ms> ..."``, a spaced window's period followed
    by ``s`` ('' for no rate)."""
    return " ".join(f"{r.count} {r.period_ms}{'s' if r.spaced else ''}" for r in rates)
