"""Renamed settings and task options (``wait_timeout`` -> ``slot_wait_timeout``, ``standby`` ->
``slot_waiters``): the new names work, the old ones still work and warn naming the new one,
both names with different values is an error naming both, and the check a worker makes at start
covers the new names."""

from __future__ import annotations

import types
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import CDeprecationWarning

from celery_semaphore import LimitedTask, limited
from celery_semaphore.integration import config, renames
from celery_semaphore.integration.decorators import spec_of
from celery_semaphore.integration.signals import _on_worker_init

URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(autouse=True)
def _fresh_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Old option names seen at decoration are remembered per process: start each test empty."""
    monkeypatch.setattr(renames, "_option_uses", {})


def _decorate(**options: Any) -> Any:
    def job() -> None: ...

    return limited("api", limit=2, **options)(job)


@pytest.fixture
def app() -> Iterator[Celery]:
    a = Celery("renamed", set_as_current=False)
    a.conf.update(semaphore_redis_url=URL)
    yield a
    a.close()


def _opts(app: Celery, **task_options: Any) -> config.ResolvedOptions:
    return config.resolve(app.conf, task_options)


# -- app settings -------------------------------------------------------------------------------


def test_new_setting_names_take_effect(app: Celery) -> None:
    app.conf.update(semaphore_slot_wait_timeout=0.0, semaphore_slot_waiters=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new names warn of nothing
        checked = config.validate_app_settings(app.conf)
        renames.warn_renamed(app.conf)
    assert checked["semaphore_slot_wait_timeout"] == 0.0
    assert checked["semaphore_slot_waiters"] == 3
    opts = _opts(app)
    assert (opts.slot_wait_timeout, opts.slot_waiters) == (0.0, 3)


@pytest.mark.parametrize(
    ("old", "new", "value"),
    [
        ("semaphore_wait_timeout", "semaphore_slot_wait_timeout", 0.5),
        ("semaphore_standby", "semaphore_slot_waiters", 4),
    ],
)
def test_old_setting_names_still_work_and_warn(
    app: Celery, old: str, new: str, value: object
) -> None:
    app.conf.update({old: value})
    assert config.validate_app_settings(app.conf)[new] == value  # no "unknown setting"
    opts = _opts(app)
    assert getattr(opts, new.removeprefix("semaphore_")) == value
    assert config.setting(app.conf, new) == value
    with pytest.warns(CDeprecationWarning) as caught:
        renames.warn_renamed(app.conf)
    (warning,) = [w for w in caught if old in str(w.message)]
    assert f"use {new!r} instead" in str(warning.message)


@pytest.mark.parametrize(
    ("old", "new", "values"),
    [
        ("semaphore_wait_timeout", "semaphore_slot_wait_timeout", (5.0, 2.0)),
        ("semaphore_standby", "semaphore_slot_waiters", (3, None)),
    ],
)
def test_old_and_new_setting_with_different_values_is_an_error(
    app: Celery, old: str, new: str, values: tuple[object, object]
) -> None:
    app.conf.update({old: values[0], new: values[1]})
    expected = (
        f"{old}={values[0]!r} and {new}={values[1]!r} are both set: {old} is the old name of "
        f"{new}; set only {new}"
    )
    with pytest.raises(ValueError, match="are both set") as info:
        config.validate_app_settings(app.conf)
    assert str(info.value) == expected
    with pytest.raises(ValueError, match=old):
        _opts(app)  # read lazily by a task too


def test_old_and_new_setting_with_the_same_value_is_accepted(app: Celery) -> None:
    app.conf.update(semaphore_wait_timeout=1.0, semaphore_slot_wait_timeout=1.0)
    assert config.validate_app_settings(app.conf)["semaphore_slot_wait_timeout"] == 1.0


def _start(app: Celery) -> None:
    """What ``worker_init`` does in a real worker (the handler celery_semaphore connects)."""
    _on_worker_init(sender=types.SimpleNamespace(app=app))


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"semaphore_slot_wait_timeout": -1}, "semaphore_slot_wait_timeout=-1"),
        ({"semaphore_slot_waiters": 0}, "semaphore_slot_waiters=0"),
        # a bad value under a former name is named as it was given
        ({"semaphore_standby": 0}, "semaphore_standby=0"),
        (
            {"semaphore_slot_wait_timout": 1},
            "semaphore_slot_wait_timout (did you mean semaphore_slot_wait_timeout?)",
        ),
        (
            {"semaphore_standby": 2, "semaphore_slot_waiters": 3},
            "semaphore_standby=2 and semaphore_slot_waiters=3 are both set",
        ),
    ],
    ids=["bad-timeout", "bad-waiters", "bad-old-name", "typo", "conflict"],
)
def test_worker_start_checks_the_new_names(
    app: Celery, settings: dict[str, Any], named: str
) -> None:
    app.conf.update(settings)
    with pytest.raises(SystemExit) as info:
        _start(app)
    assert named in str(info.value)


def test_unknown_setting_lists_only_the_new_names(app: Celery) -> None:
    app.conf.update(semaphore_nope=1)
    with pytest.raises(ValueError, match="unknown setting") as info:
        config.validate_app_settings(app.conf)
    accepted = str(info.value).split("accepts: ")[1]
    assert "semaphore_slot_wait_timeout" in accepted
    assert "semaphore_wait_timeout" not in accepted
    assert "semaphore_standby" not in accepted.replace("semaphore_worker_standby", "")


def test_django_namespace_old_name(app: Celery) -> None:
    dj = Celery("renamed-django", set_as_current=False)
    dj.config_from_object(
        types.SimpleNamespace(CELERY_SEMAPHORE_REDIS_URL=URL, CELERY_SEMAPHORE_STANDBY=2),
        namespace="CELERY",
    )
    assert config.validate_app_settings(dj.conf, "CELERY")["semaphore_slot_waiters"] == 2
    assert renames.renamed_in(dj.conf) == [("semaphore_standby", "semaphore_slot_waiters")]
    dj.close()


# -- task options and LimitedTask attributes ----------------------------------------------------


def test_new_option_names(app: Celery) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        @app.task(shared=False)
        @limited("api", limit=2, slot_wait_timeout=0, slot_waiters=1)
        def job() -> None: ...

    spec = spec_of(job)
    assert spec is not None
    options = spec.options
    assert options == {"slot_wait_timeout": 0, "slot_waiters": 1}
    assert (_opts(app, **options).slot_wait_timeout, _opts(app, **options).slot_waiters) == (0, 1)


def test_old_option_names_still_work_and_warn(app: Celery) -> None:
    with pytest.warns(CDeprecationWarning) as caught:

        @app.task(shared=False)
        @limited("api", limit=2, wait_timeout=0, standby=1)
        def job() -> None: ...

    spec = spec_of(job)
    assert spec is not None
    assert spec.options == {"slot_wait_timeout": 0, "slot_waiters": 1}
    texts = [str(w.message) for w in caught]
    assert any(
        "option wait_timeout= is deprecated" in t and "use slot_wait_timeout=" in t for t in texts
    )
    assert any("option standby= is deprecated" in t and "use slot_waiters=" in t for t in texts)
    assert all(w.filename == __file__ for w in caught), "points at the decorated function"
    # and a worker's start repeats them, in its log
    with pytest.warns(CDeprecationWarning) as again:
        renames.warn_renamed(app.conf)
    assert sorted(str(w.message) for w in again) == sorted(texts)


def test_old_limited_task_attribute_still_works_and_warns() -> None:
    with pytest.warns(CDeprecationWarning, match="attribute semaphore_wait_timeout is deprecated"):

        class Old(LimitedTask):
            semaphore_name = "gpu"
            semaphore_limit = 2
            semaphore_wait_timeout = 0.0

            def run(self) -> None: ...

    assert Old._semaphore_spec is not None
    assert Old._semaphore_spec.options == {"slot_wait_timeout": 0.0}

    class New(LimitedTask):
        semaphore_name = "gpu"
        semaphore_limit = 2
        semaphore_slot_waiters = 3

        def run(self) -> None: ...

    assert New._semaphore_spec is not None
    assert New._semaphore_spec.options == {"slot_waiters": 3}


def test_old_and_new_option_with_different_values_is_an_error() -> None:
    with pytest.raises(TypeError) as info:
        _decorate(wait_timeout=0, slot_wait_timeout=2.0)
    assert (
        "wait_timeout=0 and slot_wait_timeout=2.0 are both given: wait_timeout is the old name "
        "of slot_wait_timeout; give only slot_wait_timeout"
    ) in str(info.value)


def test_bad_value_under_an_old_option_name_is_named_as_given() -> None:
    with pytest.raises(ValueError, match=r"standby=0 is not accepted"):
        _decorate(standby=0)
    with pytest.raises(ValueError, match=r"slot_waiters=0 is not accepted"):
        _decorate(slot_waiters=0)
