"""Blocking acquire: woken by the release (not by polling), timeouts, context managers, the
runtime limit override, script reloading, and use after fork."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import pytest
import redis

from celery_semaphore import AttemptStatus, Permit, Semaphore, SemaphoreTimeout

SemaphoreFactory = Callable[..., Semaphore]
WAIT = 5.0
#: a waiter woken by a wake-up has its permit within this (a loaded CI host can stall a thread
#: for a good part of a second); a waiter that is not woken waits for its poll, POLL
WOKEN = 2.0
#: the poll interval of the wake-up tests: far beyond WOKEN and beyond a waiter's own timeout
#: (BLOCK_FOR), so that no poll can pass for a wake-up
POLL = 30.0
#: how long a test's blocked waiter waits at most (then it gives up, without a permit)
BLOCK_FOR = 10.0


def _wait_until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


class _Blocked(threading.Thread):
    def __init__(self, sem: Semaphore, timeout: float = BLOCK_FOR) -> None:
        super().__init__(daemon=True)
        self.sem = sem
        self.timeout = timeout
        self.done = threading.Event()
        self.permit: Permit | None = None
        self.granted_at = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.permit = self.sem.acquire(timeout=self.timeout)
            self.granted_at = time.monotonic()
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()


def _block_one(sem: Semaphore) -> _Blocked:
    waiter = _Blocked(sem)
    before = len(sem.waiters())
    waiter.start()
    _wait_until(lambda: len(sem.waiters()) == before + 1)
    return waiter


def test_release_wakes_a_blocked_waiter_without_polling(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("wake", 1, poll_interval=POLL)
    holder = sem.acquire(blocking=False)
    assert holder is not None
    waiter = _block_one(sem)
    time.sleep(0.1)  # let it settle into its blocking wait
    assert not waiter.done.is_set()
    released_at = time.monotonic()
    assert holder.release() is True
    assert waiter.done.wait(WOKEN), "the waiter was not woken by the release"
    assert waiter.error is None
    assert waiter.permit is not None
    assert waiter.granted_at - released_at < WOKEN
    assert [h.token for h in sem.holders()] == [waiter.permit.token]
    assert sem.waiters() == []
    waiter.permit.release()


def test_withdrawing_head_wakes_the_next_waiter(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("wake-withdraw", 2, poll_interval=POLL)
    holder = sem.acquire(blocking=False)
    assert holder is not None
    head = sem.new_ticket()
    assert sem.try_acquire(head, weight=2, place_ttl=10.0).permit is None
    waiter = _block_one(sem)  # weight 1: one unit is free, but the head is in its way
    time.sleep(0.1)
    assert not waiter.done.is_set()
    assert sem.withdraw(head) is True
    assert waiter.done.wait(WOKEN), "the waiter was not woken when the head left"
    assert waiter.permit is not None
    waiter.permit.release()
    holder.release()


def test_head_leaving_by_an_unqueued_attempt_wakes_the_next_waiter(
    make_semaphore: SemaphoreFactory,
) -> None:
    # A ticket in line that tries once more without keeping its place (place_ttl=0, the
    # try_acquire default) leaves the line; the units it stood in front of go to those behind.
    sem = make_semaphore("wake-leave", 2, poll_interval=POLL)
    holder = sem.acquire(blocking=False)
    assert holder is not None
    head = sem.new_ticket()
    assert sem.try_acquire(head, weight=2, place_ttl=10.0).permit is None
    waiter = _block_one(sem)
    time.sleep(0.1)
    assert not waiter.done.is_set()
    assert sem.try_acquire(head, weight=2).permit is None  # not granted, place given up
    assert waiter.done.wait(WOKEN), "the waiter was not woken when the head left the line"
    assert waiter.permit is not None
    assert [w.ticket for w in sem.waiters()] == []
    waiter.permit.release()
    holder.release()


def test_weight_lowered_by_head_wakes_the_next_waiter(make_semaphore: SemaphoreFactory) -> None:
    # The head asks again for less and is granted; what is left over belongs to the next one.
    sem = make_semaphore("wake-lighter", 3, poll_interval=POLL)
    holder = sem.acquire(blocking=False)
    assert holder is not None
    head = sem.new_ticket()
    assert sem.try_acquire(head, weight=3, place_ttl=10.0).permit is None
    waiter = _block_one(sem)
    time.sleep(0.1)
    lighter = sem.try_acquire(head, weight=1, place_ttl=10.0)
    assert lighter.permit is not None
    assert waiter.done.wait(WOKEN), "the waiter was not woken by the head's lighter grant"
    assert waiter.permit is not None
    waiter.permit.release()
    lighter.permit.release()
    holder.release()


def test_reclaimed_lease_wakes_a_blocked_waiter(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    sem = make_semaphore("wake-reclaim", 1, poll_interval=POLL)
    holder = sem.acquire(blocking=False)
    assert holder is not None
    waiter = _block_one(sem)
    time.sleep(0.1)
    # the holder's process died: its lease runs out, and the next operation reclaims it
    redis_client.zadd(sem.keys.expiry, {"h:" + holder.token: 0}, xx=True)
    assert sem.reclaim() == 1
    assert waiter.done.wait(WOKEN), "the waiter was not woken when the lease was reclaimed"
    assert waiter.permit is not None
    waiter.permit.release()


def test_a_sweep_reclaims_wakes_and_reads_the_boot_marker_in_one_call(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    sem = make_semaphore("sweep", 1, poll_interval=POLL)
    reclaimed, marker, fence = sem.sweep()  # a fresh state: the sweep writes its marker
    assert (reclaimed, fence) == (0, 0)
    assert sem.boot_marker() == (False, marker, 0)
    holder = sem.acquire(blocking=False)
    assert holder is not None
    waiter = _block_one(sem)
    time.sleep(0.1)
    redis_client.zadd(sem.keys.expiry, {"h:" + holder.token: 0}, xx=True)  # its process died
    assert sem.sweep() == (1, marker, holder.fencing_token)
    assert waiter.done.wait(WOKEN), "the waiter was not woken when the sweep reclaimed the lease"
    assert waiter.permit is not None
    waiter.permit.release()
    redis_client.delete(sem.keys.state)  # the state is lost: the next sweep finds a new marker
    assert sem.sweep()[1] != marker


@pytest.mark.parametrize("trigger", ["acquire", "refresh"])
def test_lease_reclaimed_by_another_operation_wakes_waiters(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis, trigger: str
) -> None:
    # Units freed by the reclaim that starts every operation belong to the waiters in line,
    # and those must be woken by whoever freed them, whatever the operation.
    sem = make_semaphore("wake-any-op", 2, poll_interval=POLL)
    dead = sem.acquire(blocking=False)
    alive = sem.acquire(blocking=False)
    assert dead is not None
    assert alive is not None
    waiter = _block_one(sem)
    time.sleep(0.1)
    redis_client.zadd(sem.keys.expiry, {"h:" + dead.token: 0}, xx=True)
    if trigger == "acquire":
        # a newcomer: not granted (the unit is the waiter's), but it freed the unit
        assert sem.acquire(blocking=False) is None
    else:
        assert alive.refresh() is True
    assert waiter.done.wait(WOKEN), f"the waiter was not woken after a reclaiming {trigger}"
    assert waiter.permit is not None
    waiter.permit.release()
    alive.release()


def test_granted_newcomer_wakes_the_waiters_the_reclaim_freed(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    sem = make_semaphore("wake-granted", 2, poll_interval=POLL)
    dead = [sem.acquire(blocking=False) for _ in range(2)]
    waiter = _block_one(sem)
    time.sleep(0.1)
    for permit in dead:
        assert permit is not None
        redis_client.zadd(sem.keys.expiry, {"h:" + permit.token: 0}, xx=True)
    # the newcomer's acquire frees two units: one is the waiter's, the other the newcomer's
    newcomer = sem.acquire(blocking=False)
    assert newcomer is not None
    assert waiter.done.wait(WOKEN), "the waiter was not woken by the reclaiming grant"
    assert waiter.permit is not None
    waiter.permit.release()
    newcomer.release()


def test_timeout_returns_none_and_leaves_no_waiter(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("timeout", 1)
    holder = sem.acquire(blocking=False)
    assert holder is not None
    started = time.monotonic()
    assert sem.acquire(timeout=0.2) is None
    waited = time.monotonic() - started
    assert 0.18 <= waited < 1.5
    assert sem.waiters() == []
    assert sem.acquire(timeout=0) is None
    assert sem.waiters() == []
    holder.release()
    # nothing left behind blocks the next caller
    assert sem.acquire(blocking=False) is not None


def test_timeout_with_own_ticket_keeps_the_place(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("timeout-ticket", 1)
    holder = sem.acquire(blocking=False)
    assert holder is not None
    ticket = sem.new_ticket()
    assert sem.acquire(timeout=0.05, ticket=ticket, place_ttl=5.0) is None
    (waiter,) = sem.waiters()
    assert waiter.ticket == ticket
    assert 4.0 < waiter.place_remaining <= 5.0
    holder.release()
    permit = sem.acquire(blocking=False, ticket=ticket)
    assert permit is not None
    assert permit.token == ticket


def test_hold_raises_semaphore_timeout_when_full(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("hold", 1)
    holder = sem.acquire(blocking=False)
    assert holder is not None
    with pytest.raises(SemaphoreTimeout) as exc_info, sem.hold(timeout=0.1):
        pytest.fail("entered a full semaphore")
    err = exc_info.value
    assert isinstance(err, TimeoutError)
    assert err.name == "hold"
    assert err.limit == 1
    assert err.waited is not None
    assert err.waited >= 0.09
    assert "hold" in str(err)
    assert sem.waiters() == []
    holder.release()

    with sem.hold(timeout=0.1) as permit:
        assert [h.token for h in sem.holders()] == [permit.token]
    assert permit.released
    assert sem.holders() == []


def test_with_semaphore_acquires_and_releases(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("with", 2, timeout=1.0)
    with sem as outer:
        assert isinstance(outer, Permit)
        assert sem.available() == 1
        with sem as inner:  # re-entrant use takes a second unit
            assert inner.token != outer.token
            assert sem.available() == 0
        assert inner.released
        assert sem.available() == 1
    assert outer.released
    assert sem.available() == 2

    def fail_inside() -> None:
        with sem:
            assert sem.available() == 1
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail_inside()
    assert sem.available() == 2


def test_with_semaphore_times_out_when_full(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("with-full", 1, timeout=0.1)
    holder = sem.acquire(blocking=False)
    assert holder is not None
    with pytest.raises(SemaphoreTimeout), sem:
        pytest.fail("entered a full semaphore")
    holder.release()


def test_limit_override(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("override", 3)
    other_client_view = make_semaphore("override", 3)
    sem.set_limit_override(1)
    assert other_client_view.inspect().limit == 1
    assert other_client_view.inspect().limit_override == 1
    first = sem.acquire(blocking=False)
    assert first is not None
    assert other_client_view.acquire(blocking=False) is None
    assert sem.available() == 0

    # raise it: two more fit
    sem.set_limit_override(3)
    more = [sem.acquire(blocking=False) for _ in range(2)]
    assert all(p is not None for p in more)
    assert sem.acquire(blocking=False) is None

    # lower it below what is held: nothing is revoked, nothing new is granted ...
    sem.set_limit_override(1)
    assert len(sem.holders()) == 3
    assert sem.available() == 0
    for permit in [first, more[0]]:
        assert permit is not None
        permit.release()
        assert sem.acquire(blocking=False) is None
    # ... until enough is released
    assert more[1] is not None
    more[1].release()
    last = sem.acquire(blocking=False)
    assert last is not None
    assert sem.acquire(blocking=False) is None

    # clearing restores the limit the Semaphore was made with
    sem.set_limit_override(None)
    assert sem.inspect().limit_override is None
    assert sem.inspect().limit == 3
    assert sem.acquire(blocking=False) is not None
    assert sem.acquire(blocking=False) is not None
    assert sem.acquire(blocking=False) is None


def test_raising_the_override_wakes_waiters(make_semaphore: SemaphoreFactory) -> None:
    sem = make_semaphore("override-wake", 3, poll_interval=POLL)
    sem.set_limit_override(1)
    holder = sem.acquire(blocking=False)
    assert holder is not None
    waiter = _block_one(sem)
    time.sleep(0.1)
    sem.set_limit_override(2)
    assert waiter.done.wait(WOKEN)
    assert waiter.permit is not None


def test_operations_survive_script_flush(
    make_semaphore: SemaphoreFactory, redis_client: redis.Redis
) -> None:
    sem = make_semaphore("noscript", 2)
    permit = sem.acquire(blocking=False)
    assert permit is not None
    redis_client.script_flush()
    assert permit.refresh() is True
    assert len(sem.holders()) == 1
    redis_client.script_flush()
    second = sem.acquire(blocking=False)
    assert second is not None
    redis_client.script_flush()
    assert permit.release() is True
    redis_client.script_flush()
    assert sem.reclaim() == 0
    redis_client.script_flush()
    assert sem.withdraw("nobody") is False
    assert second.release() is True
    assert sem.available() == 2


def test_semaphore_made_from_a_url_works(redis_url: str, key_prefix: str) -> None:
    # Regression: the first script call created the client lazily while holding the same
    # non-reentrant lock that creating the client takes, and hung forever.
    sem = Semaphore("from-url", 1, redis=redis_url, key_prefix=key_prefix)
    result: list[object] = []

    def use() -> None:
        permit = sem.acquire(timeout=1.0)
        result.append(permit is not None and permit.release())

    thread = threading.Thread(target=use, daemon=True)
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive(), "a Semaphore made from a URL hung on first use"
    assert result == [True]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_url_semaphore_works_after_fork(redis_url: str, key_prefix: str) -> None:
    sem = Semaphore("forked", 1, redis=redis_url, key_prefix=key_prefix)
    permit = sem.acquire(blocking=False)  # the parent has used the client before forking
    assert permit is not None
    permit.release()

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's cleanup
        code = 1
        try:
            child_permit = sem.acquire(timeout=2.0)
            ok = child_permit is not None and child_permit.release()
            os.write(write_fd, b"ok" if ok else b"no permit")
            code = 0
        except BaseException as exc:
            os.write(write_fd, repr(exc).encode()[:500])
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        _, status = os.waitpid(pid, 0)
        with os.fdopen(read_fd, "rb") as pipe:
            report = pipe.read().decode()
    finally:
        pass
    assert report == "ok"
    assert os.waitstatus_to_exitcode(status) == 0
    # and the parent's client still works afterwards
    again = sem.acquire(blocking=False)
    assert again is not None
    assert again.fencing_token == 3


def test_a_wait_that_keeps_its_place_never_extends_another_copys_grant(
    make_semaphore: SemaphoreFactory,
) -> None:
    """A wait that ends without a grant keeps its place with a refresh; when another copy of
    the same ticket was granted meanwhile (under its own claim), that refresh must not extend
    the other copy's lease: it carries the waiting copy's claim (issue 17)."""
    sem = make_semaphore("keep-place", 1, lease_ttl=30)
    blocker = sem.try_acquire("blocker", claim="b")
    assert blocker.permit is not None

    def other_copy_is_granted() -> bool:
        blocker.permit.release()  # type: ignore[union-attr]
        other = sem.try_acquire("T:0", claim="other-copy", lease_ttl=1)
        assert other.permit is not None
        return True  # and this wait gives up, still WAITING in its own eyes

    attempt = sem.wait(
        "T:0",
        timeout=10,
        place_ttl=5,
        keep_place=30,
        give_up=other_copy_is_granted,
        claim="this-copy",
    )
    assert attempt.status is AttemptStatus.WAITING
    [holder] = sem.holders()
    assert holder.token == "T:0"
    assert holder.lease_remaining <= 1.0, "the waiting copy's refresh extended another's lease"
    sem.release_token("T:0", claim="other-copy")
