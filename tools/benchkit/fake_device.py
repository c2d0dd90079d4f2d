"""A stand-in for the GPU behind the runner's greedy steps, for the host-path benchmarks: each step
takes `step_s` of "device" time, queued like a CUDA stream (launch returns at once; collect sleeps,
with the GIL released, until that step would be done), and every row gets a made-up token (ids
3..998: never the tiny model's BOS or EOS). Only plain greedy requests (the argmax fast path) are
served this way; overlapped launches read the fed rows' tokens of the step before (its one-token
rows'), as the graphs do."""
from __future__ import annotations

import time

from pegainfer.engine.batch import RowInput
from pegainfer.engine.step_plan import fed_order


def made_up(rows: list[RowInput]) -> list[int]:
    return [(r.token_ids[-1] * 31 + r.start_pos) % 996 + 3 for r in rows]


class FakeDevice:
    def __init__(self, step_s: float):
        self.step_s = step_s
        self.free_at = 0.0  # when the last launched step would finish
        self.last: list[int] = []  # the last launched step's tokens (what a feed reads)
        self.idle_s = 0.0  # time the "device" sat with nothing queued, between its first and last steps
        self.busy_s = 0.0
        self.launches = 0
        self.waited = 0  # launches that found the device idle (the host was the critical path)
        # idle seconds and launches by the kind of step that ended the idle time: "successor" (an
        # overlapped step fed from the one before), "decode" (decode rows only, launched on its own),
        # "prompt" (a step with prompt rows: admission or a chunk)
        self.idle_by: dict[str, list[float]] = {k: [0.0, 0] for k in ("successor", "decode", "prompt")}

    def install(self, runner) -> None:
        """Replace the runner's greedy device calls (on this instance only): its run/launch/collect
        still build the results, meter the steps and copy forks as they do on the device."""
        runner._greedy, runner._launch, runner._collect = self.step, self.launch, self.collect

    def launch(self, rows: list[RowInput], feed: list[int] | None) -> tuple[float, list[int]]:
        kind = "successor" if feed is not None else "prompt" if any(r.prompt for r in rows) else "decode"
        if feed is not None:
            rows = [r if j < 0 else RowInput(r.slot, [self.last[j]], r.start_pos) for r, j in zip(rows, feed)]
        tokens = made_up(rows)
        self.last = fed_order(rows, tokens)  # what a feed names, as the decode graphs' buffer
        now = time.perf_counter()
        if self.launches and now > self.free_at:
            self.idle_s += now - self.free_at
            self.waited += 1
            self.idle_by[kind][0] += now - self.free_at
        self.idle_by[kind][1] += 1
        self.launches += 1
        self.busy_s += self.step_s
        self.free_at = max(now, self.free_at) + self.step_s
        return self.free_at, tokens

    def snapshot(self) -> dict:
        """Counters so far (a level's share: the difference of two snapshots): busy and idle seconds
        between the first and the last step, launches, and those that found the device idle."""
        return {"device_busy_s": self.busy_s, "device_idle_s": self.idle_s, "device_launches": self.launches,
                "device_waited": self.waited,
                **{f"device_idle_s_{k}": v[0] for k, v in self.idle_by.items()},
                **{f"device_launches_{k}": v[1] for k, v in self.idle_by.items()}}

    def collect(self, launched: tuple[float, list[int]]) -> list[int]:
        done, tokens = launched
        wait = done - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        return tokens

    def step(self, rows: list[RowInput], queued=None) -> list[int]:
        launched = self.launch(rows, None)
        if queued is not None:
            queued()  # the runner's on_queued: the "device" has the step
        return self.collect(launched)
