"""The typed batch one forward pass runs: flattened tokens of several rows (requests), each row a
contiguous run of new tokens appended to that row's KV slot."""
from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True, slots=True)
class RowInput:
    slot: int  # KV cache slot of the request
    token_ids: list[int]  # new tokens this step (a prompt, a prompt chunk, or one decode token)
    start_pos: int  # position of token_ids[0]; tokens [0, start_pos) are already cached
    # a prompt chunk (even of one token): computed as a prompt, never by the decode step, whose
    # absorbed attention sums in another order (a prompt's bits must not depend on its chunking)
    prompt: bool = False


@dataclasses.dataclass(slots=True)
class Batch:
    rows: list[RowInput]
    token_ids: torch.Tensor  # [T] int64, rows concatenated
    positions: torch.Tensor  # [T] int64
    token_slots: torch.Tensor  # [T] int64, slot of each token
    last_index: torch.Tensor  # [R] index in T of each row's last token
    starts: list[int]  # [R] offset of each row in T
    context_lens: list[int]  # [R] cached tokens after this step
    decode_rows: list[int]  # rows with exactly one new token (attended together)
    prefill_rows: list[int]  # rows with several new tokens (attended one by one)

    @classmethod
    def build(cls, rows: list[RowInput], device: torch.device | str) -> Batch:
        ids, pos, slots, starts, ctx = [], [], [], [], []
        for r in rows:
            starts.append(len(ids))
            ids.extend(r.token_ids)
            pos.extend(range(r.start_pos, r.start_pos + len(r.token_ids)))
            slots.extend([r.slot] * len(r.token_ids))
            ctx.append(r.start_pos + len(r.token_ids))
        last = [s + len(r.token_ids) - 1 for s, r in zip(starts, rows)]

        def t(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.int64, device=device)

        return cls(
            rows=rows, token_ids=t(ids), positions=t(pos), token_slots=t(slots), last_index=t(last),
            starts=starts, context_lens=ctx,
            decode_rows=[i for i, r in enumerate(rows) if len(r.token_ids) == 1],
            prefill_rows=[i for i, r in enumerate(rows) if len(r.token_ids) > 1],
        )

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])
