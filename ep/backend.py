"""The one MoE contract every EP backend implements: given a layer's hidden rows and route plan,
return every route's weighted expert output in execution order. Backends differ only in how the
rows and the outputs move between the ranks that own the experts."""
from __future__ import annotations

import abc
import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import ClassVar

import torch

from ep.plan import RoutePlan

MATURITIES = ("production", "candidate", "test-only")


class RankFailure(RuntimeError):
    """An expert rank died or a collective did not finish within the configured timeout."""


@dataclasses.dataclass(slots=True)
class ExchangeCounters:
    """Per-step attribution, reset by the engine after each step."""
    routes_per_rank: list[int]
    routes_per_expert: list[int]
    collective_calls: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    exchange_s: float = 0.0

    @classmethod
    def zero(cls, world_size: int, n_experts: int) -> ExchangeCounters:
        return cls([0] * world_size, [0] * n_experts)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class ExpertBackend(abc.ABC):
    name: ClassVar[str]
    maturity: ClassVar[str]

    @classmethod
    @abc.abstractmethod
    def start(cls, spec, cfg, ownership, shard) -> ExpertBackend:
        """Bring the backend up on rank 0 (spawning or joining the expert ranks it needs).
        spec: engine.engine.EngineSpec; cfg: ModelConfig; ownership: ep.ownership.Ownership;
        shard: rank 0's own ExpertShard."""

    @abc.abstractmethod
    def expert_outputs(self, layer: int, hidden: torch.Tensor, plan: RoutePlan) -> torch.Tensor:
        """hidden: [T, H] (model dtype); returns [R, H] float32 in the plan's execution order."""

    def alignment(self, tokens: int, top_k: int):
        """Buffers for the router kernel to put a decode step's routes in expert order into
        (engine.kernels.moe_experts.Alignment), when this backend's expert kernels read them;
        None otherwise (the default: the route plan does the sorting)."""
        return None

    def expert_slots(self, layer: int, hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                     n_experts: int, aligned=None) -> torch.Tensor:
        """The decode step's form: weights, ids [T, k] (each token's routes in ascending expert
        order) -> [T, k, H] float32, route (t, j)'s weighted output at [t, j]. By default through
        the route plan and expert_outputs; a backend with a fused kernel overrides it. aligned:
        what alignment() handed out, filled by the router kernel."""
        plan = RoutePlan.build(weights, ids.long(), n_experts)
        return plan.token_major(self.expert_outputs(layer, hidden, plan))

    def check_ranks(self) -> None:
        """Raise RankFailure when an expert rank has died or gone silent. The GPU thread calls it
        while idle, so that a lost rank fails the engine (and /ready) before the next request comes,
        not when it does. Nothing to check without expert ranks (the default)."""

    def take_counters(self) -> ExchangeCounters | None:
        """Counters since the last call (None when the backend keeps none)."""
        return None

    @contextlib.contextmanager
    def uncounted(self) -> Iterator[None]:
        """Steps run inside (a CUDA graph's warm-up and capture) leave the counters as they were."""
        yield

    def mark_counters(self) -> Callable[[], ExchangeCounters | None]:
        """Called right after a step is launched, before it is read back: a function that returns
        that step's counters once the step has finished (called in launch order). By default the
        counters are complete at launch (the step ran synchronously on the host's side)."""
        counters = self.take_counters()
        return lambda: counters

    def close(self) -> None:
        """Release ranks and buffers; idempotent."""
