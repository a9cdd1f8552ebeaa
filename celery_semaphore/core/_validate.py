"""Argument checks shared by the core and the Celery layer.

Each check raises ``TypeError`` or ``ValueError`` naming the parameter, the value given and what
is accepted, and returns the value in its canonical type.
"""

from __future__ import annotations

import math
from urllib.parse import urlsplit

REDIS_SCHEMES = ("redis", "rediss", "unix")


#: the largest limit or weight: the Lua scripts count units in doubles, exact up to 2**53,
#: and add two counts (units held plus a weight), so each stays within 2**52
MAX_UNITS = 2**52
#: the longest time in seconds (about 31 years): beyond it, milliseconds overflow a float
MAX_SECONDS = 1e9


def positive_int(param: str, value: object, *, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{param} must be an int >= 1, got {type(value).__name__} {value!r}")
    if value > MAX_UNITS and (maximum is None or maximum > MAX_UNITS):
        raise ValueError(
            f"{param}={value!r} is not accepted: use an int from 1 to 2**52 ({MAX_UNITS}); "
            "larger counts lose precision in Redis's Lua numbers"
        )
    if value < 1 or (maximum is not None and value > maximum):
        accepted = f"an int from 1 to {maximum}" if maximum is not None else "an int >= 1"
        raise ValueError(f"{param}={value!r} is not accepted: use {accepted}")
    return value


def _at_most(param: str, value: float) -> float:
    if value > MAX_SECONDS:
        raise ValueError(
            f"{param}={value!r} is not accepted: use at most {MAX_SECONDS:.0f} seconds "
            "(about 31 years)"
        )
    return value


def positive_seconds(param: str, value: object) -> float:
    return _seconds(param, value, allow_none=False)


def optional_positive_seconds(param: str, value: object) -> float | None:
    return None if value is None else _seconds(param, value, allow_none=True)


def _seconds(param: str, value: object, *, allow_none: bool) -> float:
    none = " or None" if allow_none else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{param} must be a number of seconds > 0{none}, got {type(value).__name__} {value!r}"
        )
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"{param}={value!r} is not accepted: use a finite number of seconds > 0{none}"
        )
    return _at_most(param, float(value))


def non_negative_seconds(param: str, value: object) -> float:
    return _non_negative(param, value, allow_none=False)


def optional_non_negative_seconds(param: str, value: object) -> float | None:
    return None if value is None else _non_negative(param, value, allow_none=True)


def _non_negative(param: str, value: object, *, allow_none: bool) -> float:
    none = " or None" if allow_none else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{param} must be a number of seconds >= 0{none}, got {type(value).__name__} {value!r}"
        )
    if not math.isfinite(value) or value < 0:
        raise ValueError(
            f"{param}={value!r} is not accepted: use a finite number of seconds >= 0{none}"
        )
    return _at_most(param, float(value))


def name(param: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{param} must be a non-empty str, got {type(value).__name__} {value!r}")
    if not value:
        raise ValueError(f"{param}={value!r} is not accepted: use a non-empty string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"{param}={value!r} is not accepted: it must be encodable as UTF-8 (no lone surrogates)"
        ) from None
    return value


def ticket(param: str, value: object) -> str:
    """A waiter's ticket (or a holder's token): a non-empty str naming one waiter."""
    if isinstance(value, str) and value:
        return name(param, value)
    accepted = (
        "use a non-empty str naming this waiter (Semaphore.new_ticket() makes one; keep it "
        "to keep the place in line)"
    )
    if isinstance(value, str):
        raise ValueError(f"{param}={value!r} is not accepted: {accepted}")
    raise TypeError(f"{param}={value!r} ({type(value).__name__}) is not accepted: {accepted}")


def text(param: str, value: object) -> str:
    """A str passed to the scripts as it is ('' accepted)."""
    if not isinstance(value, str):
        raise TypeError(
            f"{param} must be a str ('' for none), got {type(value).__name__} {value!r}"
        )
    return value


def priority(param: str, value: object) -> int:
    """A waiter's priority: an int from 0 to 9 (higher is served earlier)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{param} must be an int from 0 to 9 (higher is served earlier), got "
            f"{type(value).__name__} {value!r}"
        )
    if not 0 <= value <= 9:
        raise ValueError(
            f"{param}={value!r} is not accepted: use an int from 0 to 9 (higher is served "
            "earlier; 0 is the default)"
        )
    return value


def optional_non_negative_int(param: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{param} must be an int >= 0 or None, got {type(value).__name__} {value!r}"
        )
    if value < 0:
        raise ValueError(f"{param}={value!r} is not accepted: use an int >= 0, or None")
    return value


def flag(param: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{param} must be True or False, got {type(value).__name__} {value!r}")
    return value


def non_negative_int(param: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{param} must be an int >= 0, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{param}={value!r} is not accepted: use an int >= 0")
    return value


def redis_url(param: str, value: str) -> str:
    scheme = urlsplit(value).scheme
    if scheme not in REDIS_SCHEMES:
        raise ValueError(
            f"{param}={value!r} is not accepted: the URL scheme must be one of "
            f"{', '.join(s + '://' for s in REDIS_SCHEMES)}"
        )
    return value


#: the longest partition name, in UTF-8 bytes (the line stores its length in four digits)
MAX_PARTITION_BYTES = 1024
#: the largest partition weight
MAX_PARTITION_WEIGHT = 1000


def partition(param: str, value: object) -> str:
    """A partition name: any str ('' is the default partition) of at most
    :data:`MAX_PARTITION_BYTES` UTF-8 bytes."""
    if not isinstance(value, str):
        raise TypeError(
            f"{param} must be a str ('' for the default partition), got "
            f"{type(value).__name__} {value!r}"
        )
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(
            f"{param}={value!r} is not accepted: it must be encodable as UTF-8 (no lone surrogates)"
        ) from None
    if size > MAX_PARTITION_BYTES:
        raise ValueError(
            f"{param}={value[:40]!r}... is not accepted: use at most {MAX_PARTITION_BYTES} "
            f"UTF-8 bytes (got {size})"
        )
    return value


def optional_positive_int(param: str, value: object) -> int | None:
    return None if value is None else positive_int(param, value)
