"""The inputs of the two step functions, as graph-static device tensors: a decode step's rows (one
new token each) and a prefill step's prompts packed back to back (fresh ones, or chunks of prompts
whose earlier chunks are cached, read through a key bank)."""
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


@dataclasses.dataclass(slots=True)
class PrefillInputs:
    token_ids: torch.Tensor  # [T] int64, prompts back to back (padding at the end)
    positions: torch.Tensor  # [T] int64, position within its own prompt (padding: 0)
    slots: torch.Tensor  # [T] int64, KV slot of its prompt (padding: the scratch slot)
    row_ids: torch.Tensor  # [T] int64, which prompt (padding tokens: a prompt of their own each)
    last_index: torch.Tensor  # [R] int64, index in T of each prompt's last token
    # prompt chunks over their earlier cache (PrefillGraphs' bank graphs; None: fresh prompts only):
    # the key bank is the cache's (bank_slots[i], bank_pos[i]) for i in [0, N), each prompt's whole
    # context (its earlier chunks and this one); bases[t]: the bank index of token t's prompt position 0
    bank_slots: torch.Tensor | None = None  # [N] int64 (padding: the scratch slot)
    bank_pos: torch.Tensor | None = None  # [N] int64 (padding: 0)
    bases: torch.Tensor | None = None  # [T] int64
