"""What one step cost on the device, for its step record: a pair of CUDA events around the forward,
and the step's counters (engine/step_counters.py: routes per rank and expert, collective calls and bytes).
The GPU thread hands a StepMeter to ModelRunner.run / launch; tools that call the runner directly
pass none and pay for neither."""
from __future__ import annotations

from collections.abc import Callable

import torch

from pegainfer.engine.step_counters import ExchangeCounters, StepCounters

Events = tuple[torch.cuda.Event, torch.cuda.Event]


class StepMeter:
    def __init__(self, counters: StepCounters, device: torch.device | str):
        self.step_counters = counters
        self._on_gpu = str(device).startswith("cuda")
        # two pairs made once and used in turn: two steps may be in flight, and each new event costs
        # host time per step
        self._pairs: list[Events] | None = None
        self._turn = 0

    def start(self) -> Events | None:
        """Record the start of a step's forward on the device (None off the GPU)."""
        if self._pairs is None:
            if not self._on_gpu:
                return None
            self._pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                           for _ in range(2)]
        self._turn ^= 1
        events = self._pairs[self._turn]
        events[0].record()
        return events

    @staticmethod
    def stop(events: Events | None) -> None:
        if events is not None:
            events[1].record()

    def stop_launched(self, events: Events | None) -> Callable[[], ExchangeCounters | None]:
        """End a launched step's timing: its counters are marked behind it on the device first, to be
        read (the returned function) once it has finished."""
        counters = self.step_counters.mark()
        self.stop(events)
        return counters

    def counters(self) -> ExchangeCounters | None:
        """The counters of the step that has just finished (run synchronously)."""
        return self.step_counters.take()

    @staticmethod
    def seconds(events: Events | None) -> float | None:
        """Device time between a recorded pair (waits for the second); None off the GPU."""
        if events is None:
            return None
        events[1].synchronize()
        return events[0].elapsed_time(events[1]) / 1e3
