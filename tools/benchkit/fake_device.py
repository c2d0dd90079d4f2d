"""A stand-in for the GPU behind the runner's greedy steps, for the host-path benchmarks: each step
takes `step_s` of "device" time, queued like a CUDA stream (launch returns at once; collect sleeps,
with the GIL released, until that step would be done), and every row gets a made-up token (ids
3..998: never the tiny model's BOS or EOS). Only plain greedy requests (the argmax fast path) are
served this way; overlapped launches read the fed rows' tokens of the step before, as the graphs do."""
from __future__ import annotations

import time

from pegainfer.engine.batch import RowInput


def made_up(rows: list[RowInput]) -> list[int]:
    return [(r.token_ids[-1] * 31 + r.start_pos) % 996 + 3 for r in rows]


class FakeDevice:
    def __init__(self, step_s: float):
        self.step_s = step_s
        self.free_at = 0.0  # when the last launched step would finish
        self.last: list[int] = []  # the last launched step's tokens (what a feed reads)

    def install(self, runner) -> None:
        """Replace the runner's greedy device calls (on this instance only): its run/launch/collect
        still build the results, meter the steps and copy forks as they do on the device."""
        runner._greedy, runner._launch, runner._collect = self.step, self.launch, self.collect

    def launch(self, rows: list[RowInput], feed: list[int] | None) -> tuple[float, list[int]]:
        if feed is not None:
            rows = [r if j < 0 else RowInput(r.slot, [self.last[j]], r.start_pos) for r, j in zip(rows, feed)]
        self.last = made_up(rows)
        self.free_at = max(time.perf_counter(), self.free_at) + self.step_s
        return self.free_at, self.last

    def collect(self, launched: tuple[float, list[int]]) -> list[int]:
        done, tokens = launched
        wait = done - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        return tokens

    def step(self, rows: list[RowInput]) -> list[int]:
        return self.collect(self.launch(rows, None))
