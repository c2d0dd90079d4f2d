"""One forward step over a batch of rows and the greedy choice of each row's next token. On CUDA the
one-token (decode) rows replay a captured graph; prompt rows run eagerly beside them."""
from __future__ import annotations

import torch

from engine.batch import Batch, RowInput
from engine.cuda_graphs import DecodeGraphs, wait_and_read
from engine.prefill_graphs import PrefillGraphs
from engine.kv_cache import MLACache
from engine.model import DeepseekV2
from engine.phases import phase


class ModelRunner:
    def __init__(self, model: DeepseekV2, cache: MLACache, device: torch.device | str,
                 graphs: DecodeGraphs | None = None, prefill_graphs: PrefillGraphs | None = None):
        self.model = model
        self.cache = cache
        self.device = device
        self.graphs = graphs
        self.prefill_graphs = prefill_graphs

    def step(self, rows: list[RowInput]) -> list[int]:
        """Run the rows' new tokens through the model; return each row's greedy next token."""
        if self.graphs is None:
            return self._eager(rows)
        decode = [i for i, r in enumerate(rows) if len(r.token_ids) == 1 and r.start_pos > 0]
        if len(decode) == len(rows):
            return self.graphs.run(rows)
        out = [0] * len(rows)
        prompt = [i for i in range(len(rows)) if i not in set(decode)]
        prompt_rows = [rows[i] for i in prompt]
        pg = self.prefill_graphs
        first = pg.run(prompt_rows) if pg is not None and pg.fits(prompt_rows) else self._eager(prompt_rows)
        for i, tok in zip(prompt, first):
            out[i] = tok
        if decode:
            for i, tok in zip(decode, self.graphs.run([rows[i] for i in decode])):
                out[i] = tok
        return out

    def _eager(self, rows: list[RowInput]) -> list[int]:
        batch = Batch.build(rows, self.device)
        logits = self.model.forward(batch, self.cache)  # [R, V]
        with phase("sampling"):
            tokens = torch.argmax(logits.float(), dim=-1)
        if tokens.is_cuda:
            return wait_and_read(tokens)
        return tokens.tolist()
