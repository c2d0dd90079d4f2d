"""`local`: one rank owns every expert; nothing moves. On CUDA (fused Triton experts or grouped GEMMs)
the expert step has no host synchronisation, so the decode step can be captured in a CUDA graph."""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from ep.backend import ExchangeCounters, ExpertBackend
from ep.experts import ExpertShard
from ep.log import log_event
from ep.ownership import OwnershipError
from ep.plan import RoutePlan


class LocalBackend(ExpertBackend):
    name = "local"
    maturity = "production"

    def __init__(self, shard: ExpertShard, n_experts: int, device: torch.device, allow_triton: bool = True):
        self.shard = shard
        self.n_experts = n_experts
        self.kernel = shard.kernel_for(device, allow_triton)
        self.graph_safe = self.kernel != "loop"  # the fused paths never read the counts on the host
        self._routes = torch.zeros(n_experts, dtype=torch.int64, device=device)  # accumulated on device
        self._ticket = torch.zeros(1, dtype=torch.int32, device=device)  # the one-launch router's (zero at rest)
        # on CUDA the counters are read into a pinned buffer and differenced on the host: one copy per
        # step, no zeroing kernel (each torch call costs the GPU machine's host tens of µs per step)
        self._host = torch.zeros(n_experts, dtype=torch.int64).pin_memory() if device.type == "cuda" else None
        self._seen = np.zeros(n_experts, dtype=np.int64)  # the totals at the last take_counters
        # overlapped steps: two more pinned copies, each with an event, used in turn (mark_counters)
        self._marks = [(torch.zeros(n_experts, dtype=torch.int64).pin_memory(), torch.cuda.Event())
                       for _ in range(2)] if device.type == "cuda" else []
        self._mark_turn = 0
        log_event("expert_kernel", backend=self.name, kernel=self.kernel, graph_safe=self.graph_safe)

    @classmethod
    def start(cls, spec, cfg, ownership, shard) -> LocalBackend:
        if ownership.world_size != 1:
            raise OwnershipError(f"the local backend runs one rank; --ep-size {ownership.world_size} needs "
                                 f"--backend host-staged or nccl")
        return cls(shard, cfg.n_routed_experts, torch.device(spec.device), allow_triton=getattr(spec, "triton_kernels", True))

    def expert_outputs(self, layer: int, hidden: torch.Tensor, plan: RoutePlan) -> torch.Tensor:
        self._routes += plan.expert_counts
        return self.shard.run_routes(layer, hidden, plan.token_index, plan.weight, plan.expert_counts, self.kernel)

    def alignment(self, tokens: int, top_k: int):
        from engine.kernels.moe_route import MAX_TOKENS
        if self.kernel != "triton" or tokens > MAX_TOKENS:  # larger steps: the route plan's path
            return None
        from engine.kernels.moe_experts import Alignment
        # the router kernel adds the routes to _routes in place (captured graphs hold this tensor:
        # it is never reassigned)
        return Alignment.empty(tokens, top_k, self._routes, self._ticket)

    def expert_slots(self, layer: int, hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                     n_experts: int, aligned=None) -> torch.Tensor:
        if self.kernel == "triton" and aligned is not None:  # no plan: the router kernel sorted the routes
            return self.shard.run_token_major(layer, hidden, weights, aligned)
        return super().expert_slots(layer, hidden, weights, ids, n_experts)

    def take_counters(self) -> ExchangeCounters:
        if self._host is None:
            per_expert = self._routes.tolist()
            self._routes.zero_()
            return ExchangeCounters([sum(per_expert)], per_expert)
        self._host.copy_(self._routes)  # the step has finished: a short synchronous copy
        return self._since_seen(self._host)

    def _since_seen(self, totals: torch.Tensor) -> ExchangeCounters:
        """The routes added since the last read, from a pinned copy of the running totals."""
        now = totals.numpy().copy()
        per_expert = (now - self._seen).tolist()
        self._seen = now
        return ExchangeCounters([sum(per_expert)], per_expert)

    @contextlib.contextmanager
    def uncounted(self):
        saved = self._routes.clone()
        try:
            yield
        finally:
            self._routes.copy_(saved)  # in place: captured graphs hold this tensor

    def mark_counters(self):
        if not self._marks:
            return super().mark_counters()
        buf, done = self._marks[self._mark_turn]
        self._mark_turn ^= 1
        buf.copy_(self._routes, non_blocking=True)  # queued behind the launched step, no wait here
        done.record()

        def read() -> ExchangeCounters:
            done.synchronize()
            return self._since_seen(buf)
        return read
