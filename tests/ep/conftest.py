"""EP test fixtures: engines built once per test module (expert ranks take seconds to spawn) and
closed at its end."""
from __future__ import annotations

import pytest
import torch

from pegainfer.engine.engine import Engine, EngineSpec, build_engine
from pegainfer.ep.plan import RoutePlan

PROMPTS = [[5, 17, 300, 44, 9], [7], list(range(2, 60)), [100, 200, 300, 400, 12, 13]]


@pytest.fixture(scope="module")
def engine_cache():
    """make(**EngineSpec fields) -> Engine, one per distinct spec in the module."""
    made: dict[tuple, Engine] = {}

    def make(**fields) -> Engine:
        key = tuple(sorted((k, str(v)) for k, v in fields.items()))
        if key not in made:
            made[key] = build_engine(EngineSpec(**fields))
        return made[key]

    yield make
    for eng in made.values():
        eng.close()


def random_batch(cfg, t: int, seed: int, dtype: torch.dtype, experts: torch.Tensor | None = None,
                 device: str = "cpu") -> tuple[torch.Tensor, RoutePlan]:
    """hidden [T, H] and the plan of T tokens routed to k distinct random experts (or `experts` [T, k])."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(t, cfg.hidden_size, generator=g).to(dtype)  # [T, H]
    k, e = cfg.num_experts_per_tok, cfg.n_routed_experts
    if experts is None:
        experts = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])  # [T, k]
    weights = torch.rand(t, k, generator=g)  # [T, k] float32
    return hidden.to(device), RoutePlan.build(weights.to(device), experts.to(device), e)
