"""The periodic stats line, as vLLM's "Avg prompt throughput ... Running ... Waiting ... KV cache
usage" line: every `--log-stats-interval` seconds (default 10; 0 turns it off) while serving, one
JSON event `stats` on the `pegainfer.stats` logger with prompt and generation tokens/s over the
interval, requests running and waiting, KV use (pages) and the preemptions so far. A line is written when
tokens moved or requests were held in the interval or the one before (so the last line of a busy
spell shows it ended), and otherwise once every IDLE_EVERY intervals. The numbers are the ones
/metrics renders: the token counters, the scheduler's snapshot, the engine's published snapshot."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import orjson

from pegainfer.daemon.runtime import Runtime
from pegainfer.telemetry.metrics import kv_usage

log = logging.getLogger("pegainfer.stats")
IDLE_EVERY = 6  # idle: one line in 6 intervals (a minute at the default 10 s)


@dataclasses.dataclass(slots=True)
class StatsLine:
    """Turns cumulative counters into one interval's line; None when there is nothing to say."""
    last_at: float
    prompt: int = 0  # the counters at the last tick
    generated: int = 0
    busy_before: bool = False
    quiet: int = 0  # ticks since the last line

    def tick(self, now: float, prompt: int, generated: int, *, running: int, waiting: int,
             kv: float, preemptions: int = 0) -> dict | None:
        elapsed = max(now - self.last_at, 1e-9)
        prompt_rate, generation_rate = (prompt - self.prompt) / elapsed, (generated - self.generated) / elapsed
        busy = bool(prompt_rate or generation_rate or running or waiting)
        self.last_at, self.prompt, self.generated = now, prompt, generated
        wanted = busy or self.busy_before or self.quiet + 1 >= IDLE_EVERY
        self.busy_before = busy
        if not wanted:
            self.quiet += 1
            return None
        self.quiet = 0
        return {"prompt_tokens_per_s": round(prompt_rate, 1), "generation_tokens_per_s": round(generation_rate, 1),
                "running": running, "waiting": waiting, "kv_cache_usage": round(kv, 4), "preemptions": preemptions,
                "interval_s": round(elapsed, 3)}


async def log_stats(rt: Runtime) -> None:
    """Run until cancelled (serve_runtime cancels it at the end)."""
    interval = rt.settings.log_stats_interval
    if interval <= 0:
        return
    line = StatsLine(time.monotonic(), *rt.telemetry.token_totals())
    while True:
        await asyncio.sleep(interval)
        scheduler, bridge = rt.scheduler, rt.bridge
        if scheduler is None or bridge is None:  # still loading
            continue
        snap, engine = scheduler.snapshot(), bridge.snapshot
        fields = line.tick(time.monotonic(), *rt.telemetry.token_totals(), running=snap["running"],
                           waiting=snap["waiting"], kv=kv_usage(engine) if engine is not None else 0.0,
                           preemptions=engine.preemptions if engine is not None else 0)
        if fields is not None:
            log.info(orjson.dumps({"event": "stats", **fields}).decode())
