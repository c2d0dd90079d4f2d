"""A launched decode step whose tokens are not read yet (overlapped decode, engine/gpu_thread.py),
which steps may be launched that way, and the rows of the step launched after one in flight."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from engine.batch import RowInput
from engine.cuda_graphs import Launched
from engine.sequence import Sequence


@dataclasses.dataclass(slots=True)
class InFlight:
    launched: Launched | list[int]  # ModelRunner.launch's handle
    seqs: list[Sequence]
    rows: list[RowInput]
    t0: float  # perf_counter at launch
    started_ns: int
    timer: tuple[torch.cuda.Event, torch.cuda.Event] | None
    overlapped: bool  # launched while the step before it was still in flight
    counters: Callable[[], object]  # the backend's counters of this step, once it has finished


def plain_decode(seqs: list[Sequence], rows: list[RowInput]) -> bool:
    """Every row decodes one token by the argmax fast path, and no sibling waits for a fork."""
    for seq, row in zip(seqs, rows):
        if not seq.plain or seq.forks or len(row.token_ids) != 1 or row.start_pos < len(seq.prompt_ids):
            return False
    return bool(rows)


def successor(prev: InFlight, running: dict) -> tuple[list[Sequence], list[RowInput], list[int]]:
    """The step after `prev`, launched before prev is read: its sequences still running that want a
    token after the one in flight, their rows (ids to come from the feed) and the feed (row j of prev)."""
    seqs, rows, feed = [], [], []
    for j, seq in enumerate(prev.seqs):
        if running.get(seq.key) is seq and len(seq.output_ids) + 1 < seq.max_tokens:
            seqs.append(seq)
            rows.append(RowInput(seq.slot, [0], seq.cached))
            feed.append(j)
    return seqs, rows, feed


def seconds(timer: tuple[torch.cuda.Event, torch.cuda.Event] | None) -> float | None:
    """Device time between a recorded pair of events (waits for the second); None off the GPU."""
    if timer is None:
        return None
    timer[1].synchronize()
    return timer[0].elapsed_time(timer[1]) / 1e3
