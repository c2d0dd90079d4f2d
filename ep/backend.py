"""The one contract every EP backend implements: given a layer's hidden rows and route plan (routes
grouped by expert, engine/model/moe.py builds it), run each route on the rank that owns its expert
and return every route's weighted expert output in execution order, for the model to combine in a
fixed order. Backends differ only in how the rows and the outputs move between ranks; what a
backend can do beyond that is declared in its `caps`, never probed."""
from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import torch

from pegainfer.ep.plan import RoutePlan

MATURITIES = ("production", "candidate", "test-only")


class RankFailure(RuntimeError):
    """An expert rank died or a collective did not finish within the configured timeout."""


@dataclasses.dataclass(frozen=True, slots=True)
class BackendCaps:
    """What a backend declares about itself.
    graph_safe: a step through it has no host synchronisation, so the decode and prefill steps can
    be captured in CUDA graphs. expert_kernel: the kernel its experts run on rank 0 ("triton",
    "grouped_mm" or "loop"; ep/experts.py). fused_alignment: it runs a decode step's routes as the
    router kernel lists them by expert (run_aligned), with no route plan: one rank owns every
    expert and nothing moves."""
    graph_safe: bool
    expert_kernel: str
    fused_alignment: bool = False


@dataclasses.dataclass(slots=True)
class Exchange:
    """What a backend moved since the last take: rank 0's collective calls, payload bytes each way,
    and the seconds its host spent exchanging (not computing its own experts)."""
    collective_calls: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    exchange_s: float = 0.0


class ExpertBackend(abc.ABC):
    name: ClassVar[str]
    maturity: ClassVar[str]
    caps: BackendCaps  # set by every backend when it starts

    @classmethod
    @abc.abstractmethod
    def start(cls, spec, cfg, ownership, shard) -> ExpertBackend:
        """Bring the backend up on rank 0 (spawning or joining the expert ranks it needs).
        spec: engine.engine.EngineSpec (its `kernels`: the KernelConfig); cfg: ModelConfig;
        ownership: ep.ownership.Ownership; shard: rank 0's own ExpertShard."""

    @abc.abstractmethod
    def expert_outputs(self, layer: int, hidden: torch.Tensor, plan: RoutePlan) -> torch.Tensor:
        """hidden: [T, H] (model dtype); returns [R, H] float32 in the plan's execution order."""

    def run_aligned(self, layer: int, hidden: torch.Tensor, weights: torch.Tensor, aligned) -> torch.Tensor:
        """Where caps.fused_alignment: every route of every token, listed by expert on the device by
        the router kernel (engine.kernels.moe_experts.Alignment), hidden [T, H], weights [T, k]
        float32 -> [T, k, H] float32, route (t, j)'s weighted output at [t, j]."""
        raise NotImplementedError(f"the {self.name} backend runs routes through a route plan only")

    def check_ranks(self) -> None:
        """Raise RankFailure when an expert rank has died or gone silent. The GPU thread calls it
        while idle, so that a lost rank fails the engine (and /ready) before the next request comes,
        not when it does. Nothing to check without expert ranks (the default)."""

    def take_exchange(self) -> Exchange:
        """What moved since the last call; nothing where nothing moves (the default)."""
        return Exchange()

    def close(self) -> None:
        """Release ranks and buffers; idempotent."""
