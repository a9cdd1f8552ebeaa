"""What a limited task asks for: built and checked once, when the task is decorated."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import _validate, config

__all__ = ["LimitSpec"]


@dataclass(frozen=True)
class LimitSpec:
    """A semaphore name and limit, plus the task-level options (see :mod:`.config`)."""

    name: str
    limit: int
    weight: int = 1
    options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def build(
        cls, name: object, limit: object, options: Mapping[str, Any], *, where: str
    ) -> LimitSpec:
        checked_name = _validate.name("name", name)
        checked_limit = _validate.positive_int("limit", limit)
        opts = config.validate_task_options(options, where=where)
        weight = opts.pop("weight", 1)
        if "heartbeat_interval" in opts and "lease_ttl" in opts:
            config.check_heartbeat(
                "heartbeat_interval", opts["heartbeat_interval"], "lease_ttl", opts["lease_ttl"]
            )
        if weight > checked_limit:
            raise ValueError(
                f"{where}: weight={weight} is not accepted with limit={checked_limit}: use a "
                f"weight from 1 to {checked_limit}"
            )
        return cls(checked_name, checked_limit, weight, opts)
