"""The route plan: execution order grouped by expert (so each rank's routes are one span), and a
combine that adds contributions token-major in ascending-expert order whatever the execution order."""
from __future__ import annotations

import torch

from pegainfer.ep.ownership import Ownership
from pegainfer.ep.plan import RoutePlan


def _plan(t: int = 7, k: int = 3, e: int = 8, seed: int = 0) -> tuple[RoutePlan, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    experts = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])  # [T, k] distinct per token
    weights = torch.rand(t, k, generator=g)
    return RoutePlan.build(weights, experts, e), weights, experts


def test_execution_order_is_expert_ascending_and_counts_match() -> None:
    plan, _, experts = _plan()
    assert plan.expert.tolist() == sorted(plan.expert.tolist())
    assert plan.expert_counts.tolist() == torch.bincount(experts.reshape(-1), minlength=8).tolist()
    # perm maps execution order back to token-major slots: every slot exactly once
    assert sorted(plan.perm.tolist()) == list(range(plan.num_tokens * plan.top_k))
    assert torch.equal(plan.token_index, plan.perm // plan.top_k)


def test_each_rank_span_holds_exactly_its_experts() -> None:
    plan, _, _ = _plan(t=11)
    counts = plan.expert_counts.tolist()
    own = Ownership(8, 3)
    spans = [plan.span(own.experts_of(r), counts) for r in range(3)]
    assert spans[0][0] == 0 and spans[-1][1] == plan.expert.shape[0]
    assert all(spans[r][1] == spans[r + 1][0] for r in range(2))  # contiguous, in rank order
    for r, (s, e) in enumerate(spans):
        assert all(x in own.experts_of(r) for x in plan.expert[s:e].tolist())


def test_combine_gives_each_token_the_sum_of_its_own_routes() -> None:
    plan, _, experts = _plan(t=5, k=3)
    # each route contributes a value naming its (token, expert): exact in float32
    contrib = (plan.token_index * 100 + plan.expert).float()[:, None].expand(-1, 4).contiguous()  # [R, H]
    out = plan.combine(contrib)  # [T, H]
    for t in range(plan.num_tokens):
        assert out[t].tolist() == [float(sum(t * 100 + e for e in experts[t].tolist()))] * 4


def test_combine_order_is_fixed_bit_for_bit() -> None:
    """Float addition is not associative: the combine must use the same order every time, so a
    reference computed slot by slot in token-major order matches it exactly."""
    plan, _, _ = _plan(t=33, k=3, seed=3)
    g = torch.Generator().manual_seed(1)
    contrib = torch.randn(plan.expert.shape[0], 16, generator=g) * torch.logspace(-3, 3, 16)  # [R, H]
    token_major = torch.empty_like(contrib)
    token_major[plan.perm] = contrib
    tm = token_major.view(plan.num_tokens, plan.top_k, 16)
    want = tm[:, 0].clone()
    for j in range(1, plan.top_k):
        want += tm[:, j]
    assert torch.equal(plan.combine(contrib), want)
