"""How the suite runs in parallel (``make unit``: pytest-xdist, then a serial phase).

Most tests spend their time waiting (a worker subprocess starting, a lease running out, a
parked task's countdown), not computing, so ``make unit`` runs them on several xdist
workers at once, a test file at a time on one worker (``--dist loadfile``: a module's shared
fixtures, such as its Celery nodes, start once).  What must not run beside busy neighbours
runs afterwards, alone: the chaos tests (several workers each, recovery times measured) and
the tests that bound a wait tightly (a fraction of a second) or measure it.

``--phase parallel`` deselects those (the ``serial`` mark), ``--phase serial`` keeps only
them, ``--phase all`` (the default: a plain ``pytest``) runs everything in one process.
"""

from __future__ import annotations

import pytest

__all__ = ["SERIAL_FILES", "SERIAL_TESTS", "SLOW_FIRST", "addoption", "modify_items"]

#: files whose every test runs in the serial phase (besides tests/chaos/, all of it): leases
#: of 0.15 s, heartbeats on leases of 0.3 s and 1 s, hung-Redis bounds of the socket timeout
#: + 1 s, fairness measured while a load runs
SERIAL_FILES = frozenset(
    {
        "tests/core/test_heartbeat.py",
        "tests/core/test_sem_leases.py",
        "tests/core/test_sem_liveness.py",
        "tests/deploy/test_hung_redis.py",
        "tests/integration/test_fairness.py",
        "tests/integration/test_heartbeat.py",
        # liveness records of 0.5 s and 0.6 s; a dead node's permits back within a bound
        "tests/integration/test_dead_node.py",
        # the median gap between spaced starts across two nodes, within 0.3 s of the interval
        # (once in 21 runs beside busy neighbours: a median of a whole interval more)
        "tests/integration/test_spaced_rates.py",
    }
)

#: single tests (node ids without parameters) that run in the serial phase: each bounds a wait
#: within a second or two, or flushes the shared server's script cache (a script of a test
#: beside it could find its script gone between loading it and running it)
SERIAL_TESTS = frozenset(
    {
        "tests/core/test_sem_blocking.py::test_operations_survive_script_flush",
        "tests/core/test_sem_rate.py::test_a_spaced_rate_starts_one_at_a_time_and_says_when_the_next_is_due",
        "tests/core/test_script_route.py::test_noscript_on_the_lean_route_loads_the_script",
        "tests/core/test_sem_adaptive.py::test_clear_throttle_ends_the_pause_and_the_lowered_limit_and_wakes_the_waiters",
        # the order in which woken threads append their tickets (FIFO asserted from it)
        "tests/core/test_sem_adaptive.py::test_partitions_keep_their_shares_across_a_pause",
        "tests/core/test_sem_blocking.py::test_timeout_returns_none_and_leaves_no_waiter",
        "tests/core/test_sem_group.py::test_withdraw_and_timeout_leave_no_place",
        "tests/core/test_sem_group.py::test_blocked_group_is_woken_by_a_release_in_any_member",
        "tests/core/test_sem_rate.py::test_a_waiter_wakes_when_the_window_opens_without_any_release",
        "tests/integration/test_eager.py::test_full_semaphore_blocks_then_times_out_without_running",
        "tests/integration/test_eager.py::test_task_max_wait_wins_over_eager_timeout",
        "tests/integration/test_gate.py::test_waiting_tasks_are_held_off_the_pool",
        "tests/integration/test_gate.py::test_release_hands_the_unit_to_a_held_task_at_once",
        "tests/integration/test_multi.py::test_the_heartbeat_keeps_a_group_held",
        "tests/integration/test_prefork_redis.py::test_release_wakes_a_parked_task_long_before_its_countdown",
        "tests/integration/test_prefork_redis.py::test_hard_time_limit_parent_releases_within_two_seconds",
        "tests/integration/test_prefork_redis.py::test_killed_child_permit_back_within_two_seconds",
        "tests/ops/test_rates.py::test_a_one_second_window_is_shown_full_then_open",
        # max_wait's end within 2 s of its bound; spaced starts' gaps on the server clock
        "tests/integration/test_max_wait_kept.py::test_max_wait_counts_from_the_first_arrival_across_a_park",
        "tests/core/test_sem_rate.py::test_spaced_starts_from_several_threads",
        # FIFO per partition within a bound of a few rate periods
        "tests/core/test_sem_rate.py::test_partitions_keep_fifo_and_shares_when_the_rate_is_the_constraint",
    }
)

#: the longest files of the parallel phase, sent to the xdist workers first so that none is
#: left running alone at the end (longest first; the rest keep pytest's order)
SLOW_FIRST = (
    "tests/integration/test_gate.py",
    "tests/integration/test_rates.py",
    "tests/integration/test_prefork_redis.py",
    "tests/integration/test_pools_brokers.py",
    "tests/deploy/test_sentinel.py",
    "tests/integration/test_standby.py",
    "tests/integration/test_claim_failing_copy.py",
    "tests/core/test_sem_model.py",
    "tests/example/test_demo.py",
    "tests/ops/test_live_workers.py",
    "tests/integration/test_redelivery.py",
    "tests/ops/test_web.py",
    "tests/ops/test_pytest_plugin.py",
    "tests/integration/test_shutdown.py",
    "tests/integration/test_claim_ids.py",
    "tests/integration/test_settings.py",
    "tests/deploy/test_cluster.py",
    "tests/integration/test_confined.py",
    "tests/core/test_sem_rate.py",
)

PHASES = ("all", "parallel", "serial")


def addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--phase",
        choices=PHASES,
        default="all",
        help="parallel: only the tests that may run beside others (under xdist); serial: "
        "only the others (the `serial` mark: chaos, tight timing); all: everything",
    )


def _is_serial(item: pytest.Item) -> bool:
    path = item.nodeid.split("::", 1)[0]
    base = item.nodeid.split("[", 1)[0]
    return (
        path.startswith("tests/chaos/")
        or path in SERIAL_FILES
        or base in SERIAL_TESTS
        or item.get_closest_marker("serial") is not None
    )


def _rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return SLOW_FIRST.index(path) if path in SLOW_FIRST else len(SLOW_FIRST)


def modify_items(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _is_serial(item):
            item.add_marker(pytest.mark.serial)
    phase = config.getoption("phase")
    if phase == "all":
        return
    want_serial = phase == "serial"
    keep: list[pytest.Item] = []
    gone: list[pytest.Item] = []
    for item in items:
        serial = item.get_closest_marker("serial") is not None
        (keep if serial == want_serial else gone).append(item)
    if gone:
        config.hook.pytest_deselected(items=gone)
    if phase == "parallel":  # stable: within a rank (a file), pytest's order
        keep.sort(key=_rank)
    items[:] = keep
