"""Offline batched greedy generation over the engine: what `pegainfer generate`, the HF oracle and
the direct benchmark run. All rows prefill in one step, then decode together in one step each."""
from __future__ import annotations

import dataclasses

from engine.batch import RowInput
from engine.engine import Engine


@dataclasses.dataclass(slots=True)
class Generation:
    prompt_ids: list[int]
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"


def generate(engine: Engine, prompts: list[list[int]], max_tokens: int, ignore_eos: bool = False) -> list[Generation]:
    for p in prompts:
        engine.check_request(p, max_tokens)
    slots = [engine.cache.allocate() for _ in prompts]
    try:
        out = [Generation(p, [], "length") for p in prompts]
        rows = [RowInput(s, p, 0) for s, p in zip(slots, prompts)]
        live = list(range(len(prompts)))
        while live:
            tokens = engine.runner.step(rows)
            next_rows, next_live = [], []
            for i, row, tok in zip(live, rows, tokens):
                g = out[i]
                g.token_ids.append(tok)
                if tok == engine.eos_id and not ignore_eos:
                    g.finish_reason = "stop"
                elif len(g.token_ids) < max_tokens:
                    next_rows.append(RowInput(row.slot, [tok], row.start_pos + len(row.token_ids)))
                    next_live.append(i)
            rows, live = next_rows, next_live
        return out
    finally:
        for s in slots:
            engine.cache.release(s)
