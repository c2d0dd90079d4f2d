"""The route plan: one MoE layer's top-k routes, grouped by (owner rank, expert) for execution, with
the permutation that puts every contribution back in token-major order for a fixed-order combine.
The EP contract's order: the model's MoE layer (engine/model/moe.py) builds it from the gate, every
backend runs it, the MoE layer combines by it."""
from __future__ import annotations

import dataclasses

import torch

from pegainfer.engine.kernels import triton_available


@dataclasses.dataclass(slots=True)
class RoutePlan:
    num_tokens: int
    top_k: int
    token_index: torch.Tensor  # [R] token of each route, execution order (R = T * k)
    expert: torch.Tensor  # [R] routed expert of each route, ascending (so grouped by owner too)
    weight: torch.Tensor  # [R] float32 gate weight of each route
    perm: torch.Tensor  # [R] slot in the token-major [T * k] layout of each execution-order route
    expert_counts: torch.Tensor  # [E] routes per expert

    @classmethod
    def build(cls, weights: torch.Tensor, experts: torch.Tensor, n_experts: int) -> RoutePlan:
        """weights, experts: [T, k] from the gate."""
        t, k = experts.shape
        # Within a token, order the k routes by expert id: the combine then adds contributions in
        # ascending expert order, as the reference's per-expert accumulation does.
        experts_sorted, idx = experts.sort(dim=-1)  # [T, k]
        weights_sorted = weights.gather(1, idx)  # [T, k]
        flat_e = experts_sorted.reshape(-1)  # [T*k] token-major
        perm = torch.argsort(flat_e, stable=True)  # [R] execution order -> token-major slot
        return cls(
            num_tokens=t,
            top_k=k,
            token_index=torch.div(perm, k, rounding_mode="floor"),
            expert=flat_e[perm],
            weight=weights_sorted.reshape(-1)[perm],
            perm=perm,
            # scatter_add rather than bincount: bincount syncs with the host on CUDA (graph-unsafe)
            expert_counts=torch.zeros(n_experts, dtype=torch.int64, device=flat_e.device).scatter_add_(
                0, flat_e, torch.ones_like(flat_e)),
        )

    def combine(self, contributions: torch.Tensor) -> torch.Tensor:
        """contributions: [R, H] float32 in execution order -> [T, H] float32, summed token-major
        in a fixed order (slot 0, then 1, ...), so every backend gives the same bits."""
        # one launch, the same order as below; chosen by availability alone, so every backend (and
        # every rank) combines with the same kernel whatever its expert kernel
        if contributions.is_cuda and triton_available():
            from pegainfer.engine.kernels.moe_combine import combine_routes
            return combine_routes(contributions, self.perm, self.top_k)
        buf = self.token_major(contributions)  # [T, k, H]
        if buf.is_cuda:  # one reduction launch; deterministic, though not the CPU's add order
            return buf.sum(dim=1)
        out = buf[:, 0].clone()
        for j in range(1, self.top_k):
            out += buf[:, j]
        return out

    def token_major(self, contributions: torch.Tensor) -> torch.Tensor:
        """contributions: [R, H] in execution order -> [T, k, H], route (t, j) at [t, j]."""
        buf = torch.empty_like(contributions)
        buf[self.perm] = contributions
        return buf.view(self.num_tokens, self.top_k, contributions.shape[1])

    def span(self, experts: range, counts: list[int]) -> tuple[int, int]:
        """[start, end) of the execution-order routes that go to `experts` (counts: host copy of
        expert_counts)."""
        start = sum(counts[: experts.start])
        return start, start + sum(counts[experts.start: experts.stop])
