"""`local`: one rank owns every expert; nothing moves."""
from __future__ import annotations

import torch

from ep.backend import ExchangeCounters, ExpertBackend
from ep.experts import ExpertShard
from ep.ownership import OwnershipError
from ep.plan import RoutePlan


class LocalBackend(ExpertBackend):
    name = "local"
    maturity = "production"

    def __init__(self, shard: ExpertShard, n_experts: int):
        self.shard = shard
        self.n_experts = n_experts
        self._counters = ExchangeCounters.zero(1, n_experts)

    @classmethod
    def start(cls, spec, cfg, ownership, shard) -> LocalBackend:
        if ownership.world_size != 1:
            raise OwnershipError(f"the local backend runs one rank; --ep-size {ownership.world_size} needs "
                             f"--backend host-staged or nccl")
        return cls(shard, cfg.n_routed_experts)

    def expert_outputs(self, layer: int, hidden: torch.Tensor, plan: RoutePlan) -> torch.Tensor:
        counts = plan.expert_counts.tolist()
        self._tally(counts)
        return self.shard.run(layer, hidden, plan.token_index, plan.weight, counts)

    def _tally(self, counts: list[int]) -> None:
        c = self._counters
        c.routes_per_rank[0] += sum(counts)
        for e, n in enumerate(counts):
            c.routes_per_expert[e] += n

    def take_counters(self) -> ExchangeCounters:
        out, self._counters = self._counters, ExchangeCounters.zero(1, self.n_experts)
        return out
