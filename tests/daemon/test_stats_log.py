"""The periodic stats line's arithmetic and cadence (daemon/stats_log.py): rates over the interval
from the cumulative token counters, a line for every busy interval and the one after, and while
idle only one in IDLE_EVERY; and the loop itself, on a runtime with a scheduler, writes the line."""
from __future__ import annotations

import asyncio
import json
import logging

from pegainfer.daemon.runtime import Runtime
from pegainfer.daemon.settings import Settings
from pegainfer.daemon.stats_log import IDLE_EVERY, StatsLine, log_stats
from pegainfer.engine.contract import EngineSnapshot
from pegainfer.lifecycle.scheduler import Scheduler
from pegainfer.telemetry.hub import Telemetry
from tests.lifecycle.fakes import FakeEngine, make_request


def test_rates_over_the_interval_and_the_fields():
    line = StatsLine(last_at=0.0, prompt=100, generated=50)
    got = line.tick(10.0, 300, 1050, running=3, waiting=1, kv=0.375)
    assert got == {"prompt_tokens_per_s": 20.0, "generation_tokens_per_s": 100.0, "running": 3, "waiting": 1,
                   "kv_cache_usage": 0.375, "preemptions": 0, "interval_s": 10.0}


def test_busy_intervals_then_one_more_then_idle_cadence():
    line = StatsLine(last_at=0.0)
    out = [line.tick(1.0, 10, 10, running=1, waiting=0, kv=0.1)]  # busy
    out.append(line.tick(2.0, 10, 10, running=0, waiting=0, kv=0.0))  # the one after: shows it ended
    for t in range(3, 3 + 2 * IDLE_EVERY):
        out.append(line.tick(float(t), 10, 10, running=0, waiting=0, kv=0.0))
    logged = [i for i, x in enumerate(out) if x is not None]
    assert logged == [0, 1, 1 + IDLE_EVERY, 1 + 2 * IDLE_EVERY]
    assert out[1]["generation_tokens_per_s"] == 0.0
    assert line.tick(100.0, 10, 10, running=0, waiting=2, kv=0.0) is not None  # requests waiting: busy


async def test_the_loop_writes_json_lines(caplog):
    caplog.set_level(logging.INFO, logger="pegainfer.stats")
    rt = Runtime(Settings(model="/nonexistent", log_stats_interval=0.01), Telemetry())

    class Bridge:
        snapshot = EngineSnapshot(steps=1, decode_batch_max=1, running=1, waiting=0, overlapped_steps=0,
                                  async_scheduling=True, kv_slots_free=3, kv_slots_total=4)
    rt.bridge = Bridge()
    rt.scheduler = Scheduler(FakeEngine(), max_active=1, max_pending=1)
    rt.scheduler.set_ready(True)
    rt.scheduler.submit(make_request("a"))
    task = asyncio.ensure_future(log_stats(rt))
    await asyncio.sleep(0.1)
    task.cancel()
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "pegainfer.stats"]
    assert lines and all(x["event"] == "stats" and x["running"] == 1 and x["kv_cache_usage"] == 0.25 for x in lines)
    rt.settings.log_stats_interval = 0
    assert await log_stats(rt) is None  # 0: off, returns at once
