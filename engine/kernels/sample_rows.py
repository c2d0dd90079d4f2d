"""The sampling kernel's inputs and outputs (engine/kernels/sample.py): the columns of a draw row's
parameters, the history bit, the top-N bound, and the row and output tuples. No Triton here, so that
the CPU path (engine/device_sampler.py with the reference sampler) imports without it."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import torch

FLOATS = ("temperature", "top_p", "min_p", "presence", "frequency", "repetition")  # SampleRows.floats columns
INTS = ("top_k", "seed", "index", "step", "row", "history_slot", "bias_slot")  # SampleRows.ints columns
HISTORY_SEEN = 1 << 30  # history bit: the token is in the prompt; the bits below count it in the output
MAX_LOGPROBS = 20


@dataclasses.dataclass(frozen=True, slots=True)
class SampleRows:
    """Each draw's parameters on the device, one row per draw: floats [S, 6] float32 (FLOATS: a
    temperature of 0 is greedy, as DrawParams makes any below GREEDY_BELOW; top_p 1 and min_p 0 are
    off) and ints [S, 7] int64 (INTS: top_k <= 0 is off; seed, choice index and step key the counter
    RNG; row: the logits row the draw reads, < R; history_slot and bias_slot: the rows of `history`
    and `bias`, -1 for none). The values are DrawParams' (engine/draw_params.py), checked there. A
    graph keeps both in static buffers and copies each step's values in."""
    floats: torch.Tensor
    ints: torch.Tensor

    @classmethod
    def build(cls, temperature: Sequence[float], *, device: torch.device | str, **columns: Sequence[float] | None
              ) -> SampleRows:
        """From per-draw sequences named as FLOATS and INTS (all but temperature optional: off,
        seed/index/step 0, row s for draw s, no slots)."""
        if unknown := set(columns) - set(FLOATS) - set(INTS):
            raise TypeError(f"unknown columns {sorted(unknown)}")
        s = len(temperature)
        default = {"top_p": [1.0] * s, "min_p": [0.0] * s, "presence": [0.0] * s, "frequency": [0.0] * s,
                   "repetition": [1.0] * s, "row": list(range(s)), "history_slot": [-1] * s, "bias_slot": [-1] * s}
        cols = {"temperature": list(temperature)} | {
            name: list(columns[name]) if columns.get(name) is not None else default.get(name, [0] * s)
            for name in FLOATS[1:] + INTS}
        return cls(torch.tensor([cols[c] for c in FLOATS], dtype=torch.float32).T.contiguous().to(device),
                   torch.tensor([cols[c] for c in INTS], dtype=torch.int64).T.contiguous().to(device))


class SampleOut(NamedTuple):
    tokens: torch.Tensor  # [S] int64
    logprobs: torch.Tensor | None  # [S] float32, the chosen tokens' raw log-probs
    top_ids: torch.Tensor | None  # [S, N] int64
    top_logprobs: torch.Tensor | None  # [S, N] float32
