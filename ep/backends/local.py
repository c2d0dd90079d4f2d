"""`local`: one rank owns every expert; nothing moves. On CUDA (fused Triton experts or grouped GEMMs)
the expert step has no host synchronisation, so the decode step can be captured in a CUDA graph, and
with the Triton experts a decode step's routes run as the router kernel lists them (run_aligned)."""
from __future__ import annotations

import torch

from pegainfer.ep.backend import BackendCaps, ExpertBackend
from pegainfer.ep.experts import ExpertKernel, ExpertShard
from pegainfer.ep.ownership import OwnershipError
from pegainfer.ep.plan import RoutePlan


class LocalBackend(ExpertBackend):
    name = "local"
    maturity = "production"

    def __init__(self, shard: ExpertShard, kernel: ExpertKernel):
        self.shard = shard
        self._kernel = kernel
        # the fused paths never read the counts on the host
        self.caps = BackendCaps(graph_safe=kernel.name != "loop", expert_kernel=kernel.name,
                                fused_alignment=kernel.name == "triton")

    @classmethod
    def start(cls, spec, cfg, ownership, shard) -> LocalBackend:
        if ownership.world_size != 1:
            raise OwnershipError(f"the local backend runs one rank; --ep-size {ownership.world_size} needs "
                                 f"--backend host-staged or nccl")
        kernels = spec.kernels
        return cls(shard, shard.kernel_for(torch.device(spec.device), kernels.triton, kernels.experts,
                                           batch_invariant=kernels.batch_invariant))

    def expert_outputs(self, layer: int, hidden: torch.Tensor, plan: RoutePlan) -> torch.Tensor:
        return self.shard.run_routes(layer, hidden, plan.token_index, plan.weight, plan.expert_counts, self._kernel)

    def run_aligned(self, layer: int, hidden: torch.Tensor, weights: torch.Tensor, aligned) -> torch.Tensor:
        if not self.caps.fused_alignment:
            return super().run_aligned(layer, hidden, weights, aligned)
        return self.shard.run_token_major(layer, hidden, weights, aligned, self._kernel)
