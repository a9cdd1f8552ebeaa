"""Settings of the example project, loaded with ``app.config_from_object``.

Everything a deployment would change comes from the environment: ``REDIS_URL`` (broker and
semaphore store) and ``EXAMPLE_KEY_PREFIX`` (the demo gives each run its own, so runs on a
shared Redis never see each other's keys, queues included).
"""

from __future__ import annotations

import os

redis_url = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
key_prefix = os.environ.get("EXAMPLE_KEY_PREFIX", "example")

broker_url = redis_url
broker_connection_retry_on_startup = True
# the broker's keys (queues, control mailboxes) under this run's prefix too
broker_transport_options = {"global_keyprefix": f"{key_prefix}:broker:"}
task_ignore_result = True

# Two queues: what a customer is waiting for, and batch work (invoices, re-encodes).
task_default_queue = "interactive"
task_routes = {
    "example_project.tasks.transcode": {"queue": "bulk"},
}
# Take one message per free slot: a worker does not sit on work another could run.
worker_prefetch_multiplier = 1
worker_hijack_root_logger = False

# celery-semaphore
# A kill switch: EXAMPLE_SEMAPHORE_ENABLED=0 runs the tasks without any limit (the demo then
# shows, and exits with status 1, how far the services get overrun).
semaphore_enabled = os.environ.get("EXAMPLE_SEMAPHORE_ENABLED", "1") != "0"
semaphore_redis_url = redis_url
semaphore_key_prefix = key_prefix
# A crashed worker's permits come back within 20 s (the heartbeat refreshes live ones).
semaphore_lease_ttl = 20.0
# Limits and queue caps can be changed here without touching the tasks' code, e.g. when the
# gateway raises our quota: {"payment-gateway": 5}; or to give bulk work less of it at night:
# semaphore_queue_limits = {"payment-gateway": {"bulk": 1}}
semaphore_limits: dict[str, int] = {}
semaphore_queue_limits: dict[str, dict[str, int]] = {}
