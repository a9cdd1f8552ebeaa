"""``semaphore_liveness_ttl``: checked at worker start like every setting, and off when 0,
None or on a Redis Cluster."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_semaphore.integration import family
from celery_semaphore.integration.config import validate_app_settings


def _app(**conf: object) -> Celery:
    app = Celery("liveness-setting", set_as_current=False)
    app.conf.update(semaphore_redis_url="redis://127.0.0.1:6399/0", **conf)
    return app


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (-1, ValueError, "semaphore_liveness_ttl=-1 is not accepted"),
        ("3", TypeError, "semaphore_liveness_ttl must be a number of seconds"),
        (True, TypeError, "semaphore_liveness_ttl must be a number of seconds"),
    ],
)
def test_a_bad_value_stops_the_worker_naming_the_setting(
    value: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        validate_app_settings(_app(semaphore_liveness_ttl=value).conf)


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        ({}, 3.0),
        ({"semaphore_liveness_ttl": 10}, 10.0),
        ({"semaphore_liveness_ttl": 0}, None),
        ({"semaphore_liveness_ttl": None}, None),
        ({"semaphore_liveness_ttl": 3.0, "semaphore_redis_cluster": True}, None),
    ],
)
def test_the_ttl_in_force(conf: dict[str, object], expected: float | None) -> None:
    app = _app(**conf)
    assert validate_app_settings(app.conf)["semaphore_liveness_ttl"] == conf.get(
        "semaphore_liveness_ttl", 3.0
    )
    assert family.liveness_ttl(app.conf) == expected
