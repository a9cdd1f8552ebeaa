"""``LimitedTask``: the class-based form of :func:`~celery_semaphore.limited`.

As a base class::

    class Transcode(LimitedTask):
        semaphore_name = "gpu"
        semaphore_limit = 4

        def run(self, video_id): ...

or as ``base=``, with the attributes as task options::

    @app.task(base=LimitedTask, semaphore_name="gpu", semaphore_limit=4)
    def transcode(video_id): ...

Class attributes (each ``semaphore_<option>`` accepts the task options of
:mod:`celery_semaphore.integration.config`):

* ``semaphore_name`` (str, required) and ``semaphore_limit`` (int >= 1, required);
* ``semaphore_weight`` (int, or a callable of the bound arguments; default 1): units each run
  takes;
* ``semaphore_partition`` (default: the delivery queue), ``semaphore_queue_limits``,
  ``semaphore_queue_weights``: fair sharing between partitions, as the ``@limited`` options;
* ``semaphore_lease_ttl``, ``semaphore_heartbeat_interval``, ``semaphore_retry_backoff``,
  ``semaphore_retry_backoff_max``, ``semaphore_retry_jitter``, ``semaphore_max_wait``,
  ``semaphore_slot_wait_timeout``, ``semaphore_slot_waiters``, ``semaphore_on_lease_lost``:
  override the app setting of the same name for this task (``semaphore_wait_timeout`` and
  ``semaphore_standby``, their former names, still work, with a warning).

The ``run`` method of every concrete subclass is wrapped when the class is created, so the
check that a name and limit are set happens at import time, never silently unlimited.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

from celery import Task

from .body import run_limited
from .config import OPTIONS, SPEC_OPTIONS
from .decorators import SPEC_ATTR
from .renames import RENAMED_OPTIONS
from .spec import QUEUE, LimitSpec

__all__ = ["LimitedTask"]

_OPTION_ATTRS = {f"semaphore_{name}": name for name in [*OPTIONS, *SPEC_OPTIONS]}
#: ... and the former attribute names, which still work (with a warning; see :mod:`.renames`)
_ATTRS = {**_OPTION_ATTRS, **{f"semaphore_{old}": old for old in RENAMED_OPTIONS}}


class LimitedTask(Task):  # type: ignore[misc]
    """A Celery Task whose body runs only while holding a permit of ``semaphore_name``."""

    semaphore_name: ClassVar[str | None] = None
    semaphore_limit: ClassVar[int | None] = None
    #: QUEUE (the default: one line per delivery queue), None (one line), a template or callable
    semaphore_partition: ClassVar[Any] = QUEUE
    _semaphore_spec: ClassVar[LimitSpec | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        run = cls.__dict__.get("run")
        if run is None:
            return  # an intermediate class; its concrete subclasses are checked
        fun = run.__func__ if isinstance(run, staticmethod) else run
        if getattr(fun, SPEC_ATTR, None) is not None:
            if cls.semaphore_name is not None:
                raise TypeError(
                    f"{cls.__qualname__}: use either @limited on the function or "
                    "semaphore_name on the LimitedTask class, not both"
                )
            return  # @limited already wraps the body
        cls._semaphore_spec = spec = _spec(cls, fun)
        cls.run = _limited_run(run, spec)


def _spec(cls: type[LimitedTask], fun: Any) -> LimitSpec:
    """The spec the class attributes give, checked; ``fun``: the body."""
    where = f"LimitedTask {cls.__qualname__}"
    if cls.semaphore_name is None or cls.semaphore_limit is None:
        raise TypeError(
            f"{where} needs semaphore_name and semaphore_limit, e.g.\n\n"
            f"    class {cls.__name__}(LimitedTask):\n        semaphore_name = 'gpu'\n"
            f"        semaphore_limit = 4\n\nor @app.task(base=LimitedTask, "
            "semaphore_name='gpu', semaphore_limit=4)"
        )
    unknown = sorted(
        a
        for a in dir(cls)
        if a.startswith("semaphore_")
        and a not in _ATTRS
        and a not in ("semaphore_name", "semaphore_limit")
    )
    if unknown:
        raise TypeError(
            f"{where}: unknown attribute(s) {', '.join(unknown)}; accepted: "
            f"semaphore_name, semaphore_limit, {', '.join(sorted(_OPTION_ATTRS))}"
        )
    options = {
        opt: getattr(cls, attr)
        for attr, opt in _ATTRS.items()
        if getattr(cls, attr, None) is not None or opt == "partition"
    }
    spec = LimitSpec.build(cls.semaphore_name, cls.semaphore_limit, options, where=where)
    spec.check_parameters(fun, where)
    return spec


def _limited_run(run: Any, spec: LimitSpec) -> Any:
    """``run`` (a method or a staticmethod) wrapped to run under ``spec``."""
    if isinstance(run, staticmethod):
        body = run.__func__

        @functools.wraps(body)
        def static_run(*args: Any, **kw: Any) -> Any:
            from celery._state import get_current_task

            return run_limited(get_current_task(), spec, lambda: body(*args, **kw), args, kw)

        return staticmethod(static_run)

    @functools.wraps(run)
    def method_run(self: Any, *args: Any, **kw: Any) -> Any:
        return run_limited(self, spec, lambda: run(self, *args, **kw), args, kw)

    return method_run
