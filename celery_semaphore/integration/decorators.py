"""``@limited``: cap how many bodies of a task run at once, across all workers.

Put it directly under the task decorator; no ``base=`` is needed::

    @app.task(bind=True)
    @limited("payment-gateway", limit=5)
    def charge(self, customer_id, amount): ...

Several semaphores at once (all or nothing, without deadlocks): stack ``@limited`` or give a
list of names.  A name may be a template of the task's parameters (``"api:{customer_id}"``:
one semaphore, and one limit, per customer) or a callable receiving the bound arguments; so
may ``weight``.  By default waiters are served fairly per queue the task was delivered from
(``partition=`` changes that; ``queue_limits=`` caps a queue, ``queue_weights=`` weights its
share).

The wrapper acquires inside the task body (so ``bind`` or not, eager or not, the user's code
never runs without a permit) and releases in a ``finally``.  It keeps the function's signature,
so Celery still checks the arguments of ``delay()``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from .body import run_limited
from .spec import LimitSpec, where_of

__all__ = ["SPEC_ATTR", "limited", "spec_of"]

SPEC_ATTR = "__semaphore__"
_F = TypeVar("_F", bound=Callable[..., Any])


def limited(
    name: str | Callable[..., str] | Sequence[str | Callable[..., str]],
    limit: int | Mapping[Any, Any] | Callable[[Mapping[str, Any]], int],
    **options: Any,
) -> Callable[[_F], _F]:
    """Limit the decorated task to ``limit`` concurrent bodies (``weight`` units each) of the
    semaphore ``name``.  ``options`` are task options from the settings table
    (:mod:`.config`) plus ``weight``, ``rate``, ``partition``, ``queue_limits`` and
    ``queue_weights``; unknown or invalid ones raise when the function is decorated (at
    import time), naming the task function, the semaphore, the option and its value.

    ``rate`` (``"100/s"``, ``["60/m", "1000/h"]``, :class:`~celery_semaphore.Rate`): at most
    so many starts per period as well, admitted with the units in one step.

    For a name template (``"llm:{customer_id}"``), ``limit`` and ``rate`` may be per key: a
    callable of the call's bound arguments, or a table by concrete name with glob patterns
    and a ``"*"`` default (see "A limit per key" in the task options docs).

    ``name`` may be a list: the task takes every one of those semaphores at once, all or
    nothing (``limit`` is then one int for all, or a dict name -> limit); so does a task with
    several ``@limited`` stacked."""
    decorator = f"@limited({name!r})"

    def decorate(fun: _F) -> _F:
        if hasattr(fun, "apply_async") or not callable(fun):
            raise TypeError(
                f"{decorator} must be placed directly under the task decorator, not above it:"
                f"\n\n    @app.task(bind=True)\n    @limited({name!r}, limit={limit})\n"
                f"    def my_task(self, ...): ...\n\ngot {fun!r}"
            )
        # built here, not when limited() is called, so that every error names the task
        where = where_of(decorator, getattr(fun, "__wrapped__", fun))
        spec = LimitSpec.build(name, limit, options, where=where)
        full = spec
        inner = getattr(fun, SPEC_ATTR, None)
        if isinstance(inner, LimitSpec):
            # stacked @limited: one wrapper takes the semaphores of both, all or nothing
            full = inner.combine(spec, where)
            fun = fun.__wrapped__  # type: ignore[attr-defined]
        full.check_parameters(fun, where)

        @functools.wraps(fun)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            from celery._state import get_current_task

            task = get_current_task()
            if task is None:
                raise RuntimeError(
                    f"{where}: the function was called outside a Celery task; call the "
                    "task (task(...), .delay(), .apply()) rather than the raw function"
                )
            return run_limited(task, full, lambda: fun(*args, **kwargs), args, kwargs)

        wrapper.__signature__ = inspect.signature(fun)  # type: ignore[attr-defined]
        setattr(wrapper, SPEC_ATTR, full)
        return wrapper  # type: ignore[return-value]

    return decorate


def spec_of(task: Any) -> LimitSpec | None:
    """The LimitSpec of a task made with ``@limited`` or ``LimitedTask``, else None."""
    spec = getattr(type(task), "_semaphore_spec", None)
    if isinstance(spec, LimitSpec):
        return spec
    fun = getattr(task, "_decorated_fun", None) or getattr(task, "run", None)
    spec = getattr(fun, SPEC_ATTR, None)
    return spec if isinstance(spec, LimitSpec) else None
