"""The MoE layer as rank 0 runs it: gate, route plan, routed experts through the EP backend,
fixed-order combine, plus the shared experts."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.config import ModelConfig
from engine.phases import phase
from ep.backend import ExpertBackend
from ep.plan import RoutePlan
from ep.router import route

if TYPE_CHECKING:
    from engine.model import MLP


class MoE:
    def __init__(self, layer: int, cfg: ModelConfig, gate_weight: torch.Tensor,
                 shared: MLP, backend: ExpertBackend):
        self.layer = layer
        self.cfg = cfg
        self.gate_weight = gate_weight.float()  # [E, H]; the gate runs in float32 whatever the model dtype
        self.shared = shared
        self.backend = backend

    def parts(self, x: torch.Tensor, side: torch.cuda.Stream | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The decode step's fused form (CUDA, Triton): x [T, H] -> (routed [T, k, H] float32, one
        weighted output per route, and shared [T, H]). The caller adds them in the next norm's
        kernel (engine/kernels/rmsnorm.py moe_rmsnorm), in the same route order as `combine`.
        side: a second stream for the shared experts, which then run beside the gate and the routed
        experts (a CUDA graph captures the two branches; SGLang overlaps DeepSeek's shared experts
        the same way). Forking after the gate measured worse on the H200 at batch 1 (docs/perf-notes.md,
        rows 15-17, `tools/gpu_probe.py --timeline`): the shared experts then compete with the
        routed expert kernels for bandwidth, where forked first they overlap the latency-bound gate."""
        from engine.kernels.moe_route import fused_route
        aligned = self.backend.alignment(x.shape[0], self.cfg.num_experts_per_tok)  # None unless its kernels take it
        if side is None:
            with phase("routing"):
                weights, ids = self._gate(fused_route, x, aligned=aligned)  # [T, k] each
            routed = self._experts(x, weights, ids, aligned)
            with phase("shared_experts"):
                return routed, self.shared.fused(x)
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side), phase("shared_experts"):
            shared = self.shared.fused(x)
        with phase("routing"):
            weights, ids = self._gate(fused_route, x, aligned=aligned)  # [T, k] each
        routed = self._experts(x, weights, ids, aligned)
        main.wait_stream(side)
        shared.record_stream(main)  # made on the side stream, read on the main one
        return routed, shared

    def _experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, aligned) -> torch.Tensor:
        with phase("experts"):
            return self.backend.expert_slots(self.layer, x, weights, ids, self.cfg.n_routed_experts, aligned)

    def _gate(self, router, x: torch.Tensor, **kernel_args) -> tuple[torch.Tensor, torch.Tensor]:
        """router: ep.router.route or its kernel form; the layer's selection settings."""
        c = self.cfg
        return router(x, self.gate_weight, top_k=c.num_experts_per_tok, method=c.topk_method, n_group=c.n_group,
                      topk_group=c.topk_group, norm_topk_prob=c.norm_topk_prob, scaling=c.routed_scaling_factor,
                      **kernel_args)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H] -> [T, H]."""
        with phase("routing"):
            weights, experts = self._gate(route, x)  # [T, k] each
            plan = RoutePlan.build(weights, experts, self.cfg.n_routed_experts)
        with phase("experts"):
            contributions = self.backend.expert_outputs(self.layer, x, plan)  # [R, H] f32
        with phase("combine"):
            routed = plan.combine(contributions).to(x.dtype)  # [T, H]
        with phase("shared_experts"):
            return routed + self.shared(x)
