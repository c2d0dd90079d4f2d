"""Retry-After from the queue depth and the recent service rate, on a fake clock: it grows with the
queue at a fixed rate, shrinks when the engine serves faster, stays within [1, 60] whole seconds,
and an idle spell neither dilutes nor ages what was measured."""
from __future__ import annotations

import math

import pytest

from pegainfer.lifecycle.rejection import QueueFull
from pegainfer.lifecycle.scheduler import Scheduler
from pegainfer.lifecycle.service_rate import RETRY_AFTER_BOUNDS_S, ServiceRate
from tests.lifecycle.fakes import FakeClock, FakeEngine, make_request, tok


def served(max_pending: int, per_second: float, n: int = 80) -> tuple[Scheduler, FakeClock]:
    """A scheduler with one slot whose engine has finished `n` requests back to back, one every
    1 / per_second seconds."""
    clock = FakeClock()
    scheduler = Scheduler(FakeEngine(), max_active=1, max_pending=max_pending, clock=clock, retry_after_s=7.0)
    scheduler.set_ready(True)
    for i in range(n):
        scheduler.submit(make_request(f"done{i}"))
        clock.tick(1.0 / per_second)
        scheduler.on_token(tok(f"done{i}", 1), 1)
        scheduler.on_finished(f"done{i}", "length")
    return scheduler, clock


def refusal(scheduler: Scheduler, queued: int) -> float:
    """Fill the slot and `queued` places in the queue, then the Retry-After of one more."""
    for i in range(queued + 1):
        scheduler.submit(make_request(f"wait{i}"))
    with pytest.raises(QueueFull) as refused:
        scheduler.submit(make_request("one-more"))
    return refused.value.retry_after_s


def test_retry_after_grows_with_the_queue_at_a_fixed_service_rate():
    got = [refusal(served(depth, per_second=2.0)[0], depth) for depth in (1, 3, 7, 15, 31)]
    assert got == [1, 2, 4, 8, 16]  # ceil((depth + 1) / 2 per second)
    assert all(float(x).is_integer() for x in got)


def test_retry_after_follows_the_service_rate():
    slow, fast = refusal(served(7, per_second=0.5)[0], 7), refusal(served(7, per_second=8.0)[0], 7)
    # 8 places at 0.5 per second is 16 s; the newest departure weighs in whole, so the estimate
    # runs a little fast when departures are seconds apart
    assert 14 <= slow <= 16 and fast == 1


def test_retry_after_is_clamped_to_whole_seconds_between_1_and_60():
    low, high = RETRY_AFTER_BOUNDS_S
    assert (low, high) == (1, 60)
    assert refusal(served(200, per_second=1.0)[0], 200) == 60
    assert refusal(served(1, per_second=100.0)[0], 1) == 1


def test_idle_time_neither_dilutes_nor_ages_the_rate():
    scheduler, clock = served(3, per_second=2.0)
    clock.tick(3600)  # an idle hour: no request held
    assert refusal(scheduler, 3) == 2


def test_before_any_busy_time_the_configured_hint_applies_then_a_bound_from_busy_time():
    clock = FakeClock()
    scheduler = Scheduler(FakeEngine(), max_active=1, max_pending=1, clock=clock, retry_after_s=7.0)
    scheduler.set_ready(True)
    assert refusal(scheduler, 1) == 7.0  # nothing measured yet
    clock.tick(5.0)  # 5 busy seconds and nobody left: at most one departure per 5 s so far
    with pytest.raises(QueueFull) as refused:
        scheduler.submit(make_request("later"))
    # one departure over the weighted busy time (10 s window): 2 places / (1 / 3.93 s) = 7.9 -> 8 s
    assert refused.value.retry_after_s == math.ceil(2 * 10 * (1 - math.exp(-5.0 / 10))) == 8


def test_service_rate_rejects_a_bad_window():
    with pytest.raises(ValueError):
        ServiceRate(FakeClock(), window_s=0)
