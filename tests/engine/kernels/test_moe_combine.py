"""engine/kernels/moe_combine.py: the prompt path's MoE epilogue. `combine_routes` adds each token's
contributions in the route plan's slot order, the CPU path's order, so the same bits; `weigh` is the
torch multiply (one rounding). Triton's CPU interpreter here; on the GPU against the same order."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.ep.plan import RoutePlan  # noqa: E402

T, H, E, K = 5, 48, 16, 4


def _plan(gen: torch.Generator, device: str = "cpu") -> RoutePlan:
    experts = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])  # [T, k] distinct
    return RoutePlan.build(torch.rand(T, K, generator=gen).to(device), experts.to(device), E)


def test_combine_and_weigh_give_the_cpu_paths_bits(triton_interpreter, gen):
    from pegainfer.engine.kernels.moe_combine import combine_routes, weigh
    plan = _plan(gen)
    contrib = torch.randn(T * K, H, generator=gen)
    assert torch.equal(combine_routes(contrib, plan.perm, K), plan.combine(contrib))
    yb = torch.randn(T * K, H, generator=gen).bfloat16()
    assert torch.equal(weigh(yb, plan.weight), yb * plan.weight[:, None])


def test_gpu_combine_adds_in_slot_order(triton_gpu, gen):
    from pegainfer.engine.kernels.moe_combine import combine_routes, weigh
    plan = _plan(gen, "cuda")
    contrib = torch.randn(T * K, H, generator=gen).cuda() * torch.logspace(-3, 3, H, device="cuda")
    token_major = plan.token_major(contrib)  # [T, k, H]
    want = token_major[:, 0].clone()
    for j in range(1, K):
        want += token_major[:, j]
    assert torch.equal(combine_routes(contrib, plan.perm, K), want)
    yb = torch.randn(T * K, H, generator=gen).cuda().bfloat16()
    assert torch.equal(weigh(yb, plan.weight), yb * plan.weight[:, None])
