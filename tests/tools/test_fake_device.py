"""tools/benchkit/fake_device.py: the stand-in device's busy and idle accounting (what
tools/dev/bench_host_path.py reports as the device-busy share), on a fake clock: queued steps leave no
idle time, a launch after the device ran dry counts the gap against the kind of step it starts."""
from __future__ import annotations

import pytest

from pegainfer.engine.batch import RowInput
from tools.benchkit import fake_device
from tools.benchkit.fake_device import FakeDevice


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(fake_device.time, "perf_counter", c)
    monkeypatch.setattr(fake_device.time, "sleep", lambda s: setattr(c, "now", c.now + s))
    return c


def test_idle_time_is_counted_against_the_step_that_ends_it(clock):
    dev = FakeDevice(0.010)
    decode = [RowInput(0, [5], 7)]
    prompt = [RowInput(1, [1, 2, 3], 0, prompt=True)]
    first = dev.launch(decode, None)  # the first launch: nothing before it counts
    dev.launch(decode, [0])  # queued behind the first: the device never waits
    dev.collect(first)
    clock.now += 0.030  # the host plans for a while after the queue ran dry (it ends at +20 ms)
    dev.step(prompt, queued=lambda: None)
    snap = dev.snapshot()
    assert snap["device_launches"] == 3 and snap["device_waited"] == 1
    assert snap["device_busy_s"] == pytest.approx(0.030)
    assert snap["device_idle_s"] == pytest.approx(0.020)
    assert snap["device_idle_s_prompt"] == pytest.approx(0.020)
    assert snap["device_idle_s_successor"] == snap["device_idle_s_decode"] == 0.0
    assert (snap["device_launches_decode"], snap["device_launches_successor"], snap["device_launches_prompt"]) == (1, 1, 1)


def test_a_fed_row_reads_the_token_of_the_step_before(clock):
    dev = FakeDevice(0.001)
    first = dev.launch([RowInput(0, [5], 7), RowInput(1, [6], 9)], None)
    second = dev.launch([RowInput(0, [0], 8), RowInput(1, [0], 10)], [1, -1])
    got = dev.collect(second)
    assert got[0] == fake_device.made_up([RowInput(0, [dev.collect(first)[1]], 8)])[0]
    assert got[1] == fake_device.made_up([RowInput(1, [0], 10)])[0]
