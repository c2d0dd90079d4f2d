"""The MoE layer as rank 0 runs it: the gate, the route plan, the routed experts through the EP
backend (which only moves rows to the ranks that own the experts and runs them), the fixed-order
combine, plus the shared experts. Two forms of one layer: the reference's (`__call__`: prompts and
the torch decode step) and the decode step's (`decode`: with the Triton kernels, the router kernel
and the expert outputs per route, combined in the next norm's launch). Both gates run with the
layer's KernelConfig: batch-invariant by default (engine/model/router.py, engine/kernels/moe_route.py),
as are the backend's experts (ep/experts.py) and the combine's fixed route order."""
from __future__ import annotations

import torch

from pegainfer.engine.config import ModelConfig
from pegainfer.engine.kernels.config import KernelConfig
from pegainfer.engine.model.mlp import MLP
from pegainfer.engine.model.route_counts import RouteCounts
from pegainfer.engine.model.router import route
from pegainfer.engine.phases import phase
from pegainfer.ep.backend import ExpertBackend
from pegainfer.ep.plan import RoutePlan


class MoE:
    def __init__(self, layer: int, cfg: ModelConfig, gate_weight: torch.Tensor, shared: MLP, backend: ExpertBackend,
                 routes: RouteCounts, ticket: torch.Tensor):
        """routes: the model's route counts (every MoE layer adds to them); ticket: [1] int32, zero at
        rest, the one-launch router's (engine/kernels/ticket.py), shared by the layers."""
        self.layer = layer
        self.cfg = cfg
        self.gate_weight = gate_weight.float()  # [E, H]; the gate runs in float32 whatever the model dtype
        self.shared = shared
        self.backend = backend
        self.routes = routes
        self.ticket = ticket
        self.kernels: KernelConfig = shared.kernels

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H] -> [T, H]."""
        with phase("routing"):
            weights, experts = self._gate(route, x)  # [T, k] each
            plan = RoutePlan.build(weights, experts, self.cfg.n_routed_experts)
        with phase("experts"):
            self.routes.add(plan.expert_counts)
            contributions = self.backend.expert_outputs(self.layer, x, plan)  # [R, H] f32
        with phase("combine"):
            routed = plan.combine(contributions).to(x.dtype)  # [T, H]
        with phase("shared_experts"):
            return routed + self.shared(x)

    def decode(self, x: torch.Tensor, side: torch.cuda.Stream | None = None):
        """The decode step's form: x [T, H] -> the layer's output [T, H] (the reference's form), or,
        with the Triton kernels, its parts (routed [T, k, H] float32, one weighted output per route,
        and shared [T, H]), which the next norm's kernel adds in the same route order as the
        combine (engine/kernels/rmsnorm.py moe_rmsnorm).
        side: a second stream for the shared experts, which then run beside the gate and the routed
        experts (a CUDA graph captures the two branches; SGLang overlaps DeepSeek's shared experts
        the same way). Forking after the gate measured worse on the H200 at batch 1 (docs/perf-notes.md,
        rows 15-17): the shared experts then compete with the routed expert kernels for bandwidth,
        where forked first they overlap the latency-bound gate."""
        if not self.kernels.triton:
            return self(x)
        aligned = self._alignment(x.shape[0])  # None unless the backend's experts read the router's listing
        if side is None:
            weights, ids = self._fused_gate(x, aligned)  # [T, k] each
            routed = self._experts(x, weights, ids, aligned)
            with phase("shared_experts"):
                return routed, self.shared.decode(x)
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side), phase("shared_experts"):
            shared = self.shared.decode(x)
        weights, ids = self._fused_gate(x, aligned)  # [T, k] each
        routed = self._experts(x, weights, ids, aligned)
        main.wait_stream(side)
        shared.record_stream(main)  # made on the side stream, read on the main one
        return routed, shared

    def _alignment(self, tokens: int):
        """Buffers for the router kernel to list a decode step's routes by expert into
        (engine/kernels/moe_experts.Alignment), where the backend's experts read them
        (BackendCaps.fused_alignment) and the kernel lists that many tokens at once; None otherwise
        (the route plan does the sorting). The ticket, where the router takes one launch."""
        from pegainfer.engine.kernels.moe_route import MAX_TOKENS
        if not self.backend.caps.fused_alignment or tokens > MAX_TOKENS:
            return None
        from pegainfer.engine.kernels.moe_experts import Alignment
        ticket = self.ticket if self.kernels.router_one_launch else None
        # the router kernel adds the routes to the totals in place (captured graphs hold the tensor)
        return Alignment.empty(tokens, self.cfg.num_experts_per_tok, self.routes.totals, ticket)

    def _fused_gate(self, x: torch.Tensor, aligned) -> tuple[torch.Tensor, torch.Tensor]:
        from pegainfer.engine.kernels.moe_route import fused_route
        with phase("routing"):
            return self._gate(fused_route, x, aligned=aligned)

    def _experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, aligned) -> torch.Tensor:
        """weights, ids [T, k] (each token's routes in ascending expert order) -> [T, k, H] float32,
        route (t, j)'s weighted output at [t, j]: from the router's listing where it made one, else
        through the route plan."""
        with phase("experts"):
            if aligned is not None:  # no plan: the router kernel listed the routes by expert
                return self.backend.run_aligned(self.layer, x, weights, aligned)
            plan = RoutePlan.build(weights, ids.long(), self.cfg.n_routed_experts)
            self.routes.add(plan.expert_counts)
            return plan.token_major(self.backend.expert_outputs(self.layer, x, plan))

    def _gate(self, router, x: torch.Tensor, **kernel_args) -> tuple[torch.Tensor, torch.Tensor]:
        """router: engine.model.router.route or its kernel form; the layer's selection settings and
        KernelConfig (batch_invariant: a token's routes the same in any step, both forms)."""
        c = self.cfg
        return router(x, self.gate_weight, top_k=c.num_experts_per_tok, method=c.topk_method, n_group=c.n_group,
                      topk_group=c.topk_group, norm_topk_prob=c.norm_topk_prob, scaling=c.routed_scaling_factor,
                      kernels=self.kernels, **kernel_args)
