"""The MoE layer as rank 0 runs it: gate, route plan, routed experts through the EP backend,
fixed-order combine, plus the shared experts."""
from __future__ import annotations

from collections.abc import Callable

import torch

from engine.config import ModelConfig
from engine.phases import phase
from ep.backend import ExpertBackend
from ep.plan import RoutePlan
from ep.router import route


class MoE:
    def __init__(self, layer: int, cfg: ModelConfig, gate_weight: torch.Tensor,
                 shared: Callable[[torch.Tensor], torch.Tensor], backend: ExpertBackend):
        self.layer = layer
        self.cfg = cfg
        self.gate_weight = gate_weight.float()  # [E, H]; the gate runs in float32 whatever the model dtype
        self.shared = shared
        self.backend = backend

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H] -> [T, H]."""
        c = self.cfg
        with phase("routing"):
            weights, experts = route(x, self.gate_weight, top_k=c.num_experts_per_tok, method=c.topk_method,
                                     n_group=c.n_group, topk_group=c.topk_group, norm_topk_prob=c.norm_topk_prob,
                                     scaling=c.routed_scaling_factor)  # [T, k] each
            plan = RoutePlan.build(weights, experts, c.n_routed_experts)
        with phase("experts"):
            contributions = self.backend.expert_outputs(self.layer, x, plan)  # [R, H] f32
        with phase("combine"):
            routed = plan.combine(contributions).to(x.dtype)  # [T, H]
        with phase("shared_experts"):
            return routed + self.shared(x)
