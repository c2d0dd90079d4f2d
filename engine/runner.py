"""One forward step over a batch of rows and the greedy choice of each row's next token."""
from __future__ import annotations

import torch

from engine.batch import Batch, RowInput
from engine.kv_cache import MLACache
from engine.phases import phase
from engine.model import DeepseekV2


class ModelRunner:
    def __init__(self, model: DeepseekV2, cache: MLACache, device: torch.device | str):
        self.model = model
        self.cache = cache
        self.device = device

    def step(self, rows: list[RowInput]) -> list[int]:
        """Run the rows' new tokens through the model; return each row's greedy next token."""
        batch = Batch.build(rows, self.device)
        logits = self.model.forward(batch, self.cache)  # [R, V]
        with phase("sampling"):
            return torch.argmax(logits.float(), dim=-1).tolist()
