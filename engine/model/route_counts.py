"""Routes per expert, counted where the MoE layers route: the per-step attribution of a step record
(engine/step_counters.py adds the ranks and what the EP backend moved). The counts accumulate on the
device (the router kernel adds each expert's count in place, the route plan's path adds the plan's
counts), so counting costs a decode step no host synchronisation and CUDA graphs replay it."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import numpy as np
import torch


class RouteCounts:
    def __init__(self, n_experts: int, device: torch.device | str):
        device = torch.device(device)
        # the running totals; captured graphs hold this tensor, so it is only ever changed in place
        self.totals = torch.zeros(n_experts, dtype=torch.int64, device=device)  # [E]
        # on CUDA the totals are read into a pinned buffer and differenced on the host: one copy per
        # step, no zeroing kernel (each torch call costs the GPU machine's host tens of µs per step)
        self._host = torch.zeros(n_experts, dtype=torch.int64).pin_memory() if device.type == "cuda" else None
        self._seen = np.zeros(n_experts, dtype=np.int64)  # the totals at the last take
        # overlapped steps: two more pinned copies, each with an event, used in turn (mark)
        self._marks = [(torch.zeros(n_experts, dtype=torch.int64).pin_memory(), torch.cuda.Event())
                       for _ in range(2)] if device.type == "cuda" else []
        self._mark_turn = 0

    def add(self, counts: torch.Tensor) -> None:
        """counts: [E] routes per expert of one MoE call (a route plan's expert_counts)."""
        self.totals += counts

    def take(self) -> list[int]:
        """Routes per expert since the last take (the steps run have finished)."""
        if self._host is None:
            per_expert = self.totals.tolist()
            self.totals.zero_()
            return per_expert
        self._host.copy_(self.totals)  # the step has finished: a short synchronous copy
        return self._since_seen(self._host)

    def mark(self) -> Callable[[], list[int]]:
        """Called right after a step is launched, before it is read back: a function that returns
        that step's counts once it has finished (called in launch order). Off CUDA the step ran on
        the host's side: its counts are complete now."""
        if not self._marks:
            counts = self.take()
            return lambda: counts
        buf, done = self._marks[self._mark_turn]
        self._mark_turn ^= 1
        buf.copy_(self.totals, non_blocking=True)  # queued behind the launched step, no wait here
        done.record()

        def read() -> list[int]:
            done.synchronize()
            return self._since_seen(buf)
        return read

    @contextlib.contextmanager
    def uncounted(self) -> Iterator[None]:
        """Steps run inside (a CUDA graph's warm-up and capture) leave the counts as they were."""
        saved = self.totals.clone()
        try:
            yield
        finally:
            self.totals.copy_(saved)  # in place: captured graphs hold this tensor

    def _since_seen(self, totals: torch.Tensor) -> list[int]:
        """The routes added since the last read, from a pinned copy of the running totals."""
        now = totals.numpy().copy()
        per_expert = (now - self._seen).tolist()
        self._seen = now
        return per_expert
