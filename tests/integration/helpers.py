"""Reading the independent bookkeeping and the semaphore's state after a run."""

from __future__ import annotations

from typing import Any

from celery_semaphore import Semaphore

from .workers import Env


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def started(env: Env) -> list[str]:
    """Tags in the order their bodies started."""
    return [_text(x).split(":")[0] for x in env.redis().lrange(f"{env.prefix}:started", 0, -1)]


def max_inside(env: Env, name: str = "main") -> int:
    return int(env.redis().get(f"{env.prefix}:max:{name}") or 0)


def inside(env: Env, name: str = "main") -> int:
    return int(env.redis().get(f"{env.prefix}:inside:{name}") or 0)


def ran(env: Env) -> list[str]:
    return [_text(x) for x in env.redis().lrange(f"{env.prefix}:ran", 0, -1)]


def semaphore(env: Env, name: str = "main", limit: int | None = None) -> Semaphore:
    return Semaphore(name, limit or env.limit, redis=env.redis_url, key_prefix=env.prefix)


def holders(env: Env, name: str = "main") -> list[Any]:
    return semaphore(env, name).holders()


BOOKKEEPING = ("inside:*", "max:*", "ran", "started", "finished", "pid:*", "unlimited")


def reset_bookkeeping(env: Env) -> None:
    """Forget the counters and ledgers, but not the semaphore's own state (its tombstones
    are what tell a late duplicate copy of a finished task to drop itself)."""
    r = env.redis()
    for pattern in BOOKKEEPING:
        for key in r.scan_iter(match=f"{env.prefix}:{pattern}"):
            r.delete(key)
