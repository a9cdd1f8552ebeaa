"""The checks of the settings table and of the task options say exactly what they said
before the table moved out of ``config``: the messages are the user's only guide to a bad
value, so they are pinned here, one per kind of check."""

from __future__ import annotations

from typing import Any

import pytest

from celery_semaphore.integration import config
from celery_semaphore.integration.spec import LimitSpec

ERRORS = {"TypeError": TypeError, "ValueError": ValueError}

BAD_SETTINGS = [
    ("semaphore_redis_url", 5, "TypeError", "semaphore_redis_url must be a str, got int 5"),
    (
        "semaphore_redis_url",
        "http://x",
        "ValueError",
        (
            "semaphore_redis_url='http://x' is not accepted: the URL scheme must be one of "
            "redis://, rediss://, unix://, sentinel://"
        ),
    ),
    (
        "semaphore_redis_cluster",
        "yes",
        "TypeError",
        "semaphore_redis_cluster must be True or False, got str 'yes'",
    ),
    ("semaphore_hash_tag", 3, "TypeError", "semaphore_hash_tag must be a non-empty str, got int 3"),
    (
        "semaphore_limits",
        [1],
        "TypeError",
        "semaphore_limits must be a dict of semaphore name -> limit, got list [1]",
    ),
    (
        "semaphore_limits",
        {"a": 0},
        "ValueError",
        "semaphore_limits['a']=0 is not accepted: use an int >= 1",
    ),
    (
        "semaphore_limits",
        {3: 1},
        "TypeError",
        (
            "semaphore_limits keys must be semaphore names (str), got int 3; use an exact "
            "semaphore name ('openai'), a name template as written in code "
            "('api:{customer_id}') or a glob pattern ('llm:*', 'db-?', 'shard-[0-9]')"
        ),
    ),
    (
        "semaphore_rates",
        5,
        "TypeError",
        "semaphore_rates must be a dict of semaphore name -> rate, got int 5",
    ),
    (
        "semaphore_queue_limits",
        [],
        "TypeError",
        (
            "semaphore_queue_limits must be a dict of semaphore name -> {partition name -> "
            "int}, got list []"
        ),
    ),
    (
        "semaphore_queue_limits",
        {"a": [1]},
        "TypeError",
        (
            "semaphore_queue_limits['a'] must be a dict of partition (queue) name -> cap "
            "(int >= 1), got list [1]"
        ),
    ),
    (
        "semaphore_queue_limits",
        {"a": {"q": 0}},
        "ValueError",
        "semaphore_queue_limits['a']['q']=0 is not accepted: use an int >= 1",
    ),
    (
        "semaphore_queue_weights",
        {"a": {1: 2}},
        "TypeError",
        "semaphore_queue_weights['a'] keys must be partition (queue) names (str), got int 1",
    ),
    (
        "semaphore_queue_weights",
        {"a": {"q": 1001}},
        "ValueError",
        "semaphore_queue_weights['a']['q']=1001 is not accepted: use an int from 1 to 1000",
    ),
    ("semaphore_enabled", 1, "TypeError", "semaphore_enabled must be True or False, got int 1"),
    (
        "semaphore_worker_hold",
        -1,
        "ValueError",
        "semaphore_worker_hold=-1 is not accepted: use an int >= 0",
    ),
    (
        "semaphore_worker_hold",
        "1",
        "TypeError",
        "semaphore_worker_hold must be an int >= 0, got str '1'",
    ),
    (
        "semaphore_worker_hold",
        True,
        "TypeError",
        "semaphore_worker_hold must be an int >= 0, got bool True",
    ),
    (
        "semaphore_worker_standby",
        "2",
        "TypeError",
        "semaphore_worker_standby must be an int >= 0 or None, got str '2'",
    ),
    (
        "semaphore_worker_standby",
        -1,
        "ValueError",
        "semaphore_worker_standby=-1 is not accepted: use an int >= 0",
    ),
    (
        "semaphore_worker_standby",
        False,
        "TypeError",
        "semaphore_worker_standby must be an int >= 0 or None, got bool False",
    ),
    (
        "semaphore_restart_policy",
        "x",
        "ValueError",
        "semaphore_restart_policy='x' is not accepted: use one of fail_closed, fail_open",
    ),
    (
        "semaphore_restart_policy",
        ["fail_open"],
        "ValueError",
        "semaphore_restart_policy=['fail_open'] is not accepted: use one of fail_closed, fail_open",
    ),
    (
        "semaphore_metrics_port",
        0,
        "ValueError",
        "semaphore_metrics_port=0 is not accepted: use a TCP port (an int from 1 to 65535) or None",
    ),
    (
        "semaphore_metrics_port",
        True,
        "ValueError",
        (
            "semaphore_metrics_port=True is not accepted: use a TCP port (an int from 1 to "
            "65535) or None"
        ),
    ),
    (
        "semaphore_metrics_address",
        "",
        "ValueError",
        (
            "semaphore_metrics_address='' is not accepted: use an IP address or host name "
            "to listen on, e.g. '0.0.0.0' (all interfaces) or '127.0.0.1'"
        ),
    ),
    (
        "semaphore_slot_waiters",
        0,
        "ValueError",
        "semaphore_slot_waiters=0 is not accepted: use an int >= 1",
    ),
    (
        "semaphore_slot_waiters",
        True,
        "TypeError",
        "semaphore_slot_waiters must be an int >= 1, got bool True",
    ),
    (
        "semaphore_on_lease_lost",
        "x",
        "ValueError",
        "semaphore_on_lease_lost='x' is not accepted: use one of log, raise",
    ),
]


@pytest.mark.parametrize(("setting", "value", "error", "message"), BAD_SETTINGS)
def test_a_bad_setting_stops_a_worker_with_its_message(
    setting: str, value: Any, error: str, message: str
) -> None:
    with pytest.raises(ERRORS[error]) as raised:
        config.validate_app_settings({setting: value})
    assert str(raised.value) == message


BAD_OPTIONS = [
    (
        {"adaptive": "yes"},
        "TypeError",
        "@limited('api') on t: adaptive must be True or False, got str 'yes'",
    ),
    (
        {"queue_limits": {"q": 0}},
        "ValueError",
        "@limited('api') on t: queue_limits['q']=0 is not accepted: use an int >= 1",
    ),
    (
        {"queue_weights": [1]},
        "TypeError",
        (
            "@limited('api') on t: queue_weights must be a dict of partition (queue) name "
            "-> weight (int from 1 to 1000), got list [1]"
        ),
    ),
    (
        {"on_lease_lost": "x"},
        "ValueError",
        "@limited('api') on t: on_lease_lost='x' is not accepted: use one of log, raise",
    ),
    (
        {"slot_waiters": 0},
        "ValueError",
        "@limited('api') on t: slot_waiters=0 is not accepted: use an int >= 1",
    ),
]


@pytest.mark.parametrize(("options", "error", "message"), BAD_OPTIONS)
def test_a_bad_task_option_fails_at_decoration_with_its_message(
    options: dict[str, Any], error: str, message: str
) -> None:
    with pytest.raises(ERRORS[error]) as raised:
        LimitSpec.build("api", 2, options, where="@limited('api') on t")
    assert str(raised.value) == message


def test_per_semaphore_settings_come_back_checked() -> None:
    checked = config.validate_app_settings(
        {
            "semaphore_queue_limits": {"a": None, "b": {"q": 2}},
            "semaphore_worker_standby": 0,
            "semaphore_slot_waiters": None,
        }
    )
    assert checked["semaphore_queue_limits"] == {"a": {}, "b": {"q": 2}}
    assert checked["semaphore_worker_standby"] == 0
    assert checked["semaphore_slot_waiters"] is None
    assert checked["semaphore_worker_hold"] == 1000
