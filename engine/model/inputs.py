"""The inputs of the two step functions, as graph-static device tensors: a decode step's rows (one
new token each) and a prefill step's fresh prompts packed back to back."""
from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(slots=True)
class DecodeInputs:
    token_ids: torch.Tensor  # [B] int64
    positions: torch.Tensor  # [B] int64, position of the new token
    slots: torch.Tensor  # [B] int64, KV slot of each row
    ctx_lens: torch.Tensor  # [B] int64, cached tokens after this step (= positions + 1)
    length: int  # static attention bound >= every ctx_len (a bucket, so one graph serves many steps)
    # what the step's layers share, made by the first that needs it (the fixed attention plan's work
    # list, engine/kernels/mla_fixed.py): inside a graph it is captured once and replayed with it
    memo: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class PrefillInputs:
    token_ids: torch.Tensor  # [T] int64, prompts back to back (padding at the end)
    positions: torch.Tensor  # [T] int64, position within its own prompt (padding: 0)
    slots: torch.Tensor  # [T] int64, KV slot of its prompt (padding: the scratch slot)
    row_ids: torch.Tensor  # [T] int64, which prompt (padding tokens: a prompt of their own each)
    last_index: torch.Tensor  # [R] int64, index in T of each prompt's last token
    # the batch-invariant form only (engine/prefill_graphs.py): prompts may continue a cached prefix
    # (positions from their start); each row's keys are gathered from the paged cache, every row's
    # positions 0 .. end-1 back to back: bank_index [NB] the flat cache rows (page * P + offset) and
    # bases [T] the bank row of each token's position 0. None: fresh prompts, the pack its own keys
    bank_index: torch.Tensor | None = None
    bases: torch.Tensor | None = None
