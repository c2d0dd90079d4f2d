"""engine/kernels/moe_experts.py: the routed experts' SwiGLU MLP as two launches computes what
ExpertShard.run (the per-expert loop, the reference order) computes, in both forms: a shard's routes
in the plan's execution order (what every backend runs, a multi-rank one over rows already gathered)
and every token's routes as the router kernel listed them (the decode step's form); and a dense
SwiGLU's gate and up in one launch. Triton's CPU interpreter, float32; on the GPU the dense form at
lite's shapes against cuBLAS and the SwiGLU launch, and the same bits on every CUDA-graph replay."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.engine.kernels.config import ExpertTilings, KernelConfig, Tiling  # noqa: E402
from pegainfer.ep.experts import ExpertShard  # noqa: E402
from pegainfer.ep.plan import RoutePlan  # noqa: E402

T, H, E, K, I = 5, 48, 16, 4, 40
TILINGS = ExpertTilings()


def _shard(gen: torch.Generator, n: int) -> ExpertShard:
    return ExpertShard(range(n), {0: torch.randn(n, 2 * I, H, generator=gen) / 8}, {0: torch.randn(n, H, I, generator=gen) / 8})


def test_both_forms_are_the_per_expert_loop(triton_interpreter, gen):
    from pegainfer.engine.kernels.moe_experts import Alignment, fused_experts, fused_experts_token_major
    from pegainfer.engine.kernels.moe_route import fused_route
    x = torch.randn(T, H, generator=gen)
    gate = torch.randn(E, H, generator=gen)
    shard = _shard(gen, E)
    w13, w2 = shard.w13[0], shard.w2[0]
    w, e = fused_route(x, gate, top_k=K)
    plan = RoutePlan.build(w, e.long(), E)
    counts = plan.expert_counts.tolist()
    want = shard.run(0, x, plan.token_index, plan.weight, counts)  # [R, H] execution order
    got = fused_experts(x, w13, w2, plan.token_index, plan.weight, plan.expert_counts, TILINGS.tiling_for(T * K))
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    # the decode step's form: the routes as the router listed them, run token-major
    al = Alignment.empty(T, K, torch.zeros(E, dtype=torch.int64))
    w_a, _ = fused_route(x, gate, top_k=K, aligned=al)
    slots = fused_experts_token_major(x, w13, w2, w_a, al, TILINGS.tiling_for(T * K))  # [T, K, H]
    assert torch.allclose(slots, plan.token_major(want), atol=1e-5), (slots - plan.token_major(want)).abs().max()
    # a shard's routes as a multi-rank backend hands them over: rows arrive already gathered
    sub = range(4, 12)
    lo, hi = plan.span(sub, counts)
    rows = x[plan.token_index[lo:hi]]
    got = fused_experts(rows, w13[4:12], w2[4:12], torch.arange(hi - lo), plan.weight[lo:hi], plan.expert_counts[4:12],
                        TILINGS.tiling_for(T * K))
    assert torch.allclose(got, want[lo:hi], atol=1e-5)


CASES = [(20, K, E, dict()), (20, K, E, dict(method="group_limited_greedy", n_group=4, topk_group=2)),
         (1, K, E, dict()), (17, 1, 64, dict()), (3, 1, 64, dict()),
         (5, K, E, dict(method="group_limited_greedy", n_group=4, topk_group=2)),
         (6, 3, 10, dict()), (18, 3, 10, dict(norm_topk_prob=True, scaling=2.5))]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}x{c[1]}of{c[2]}" for c in CASES])
def test_token_major_form_of_every_listing(triton_interpreter, gen, case):
    """Every shape of the router's listing, as the decode step makes it (with the ticket: the
    one-launch form up to 16 tokens; tests/engine/kernels/test_moe_route.py checks that both forms
    list the same): the experts' outputs per route are the per-expert loop's."""
    from pegainfer.engine.kernels.moe_experts import Alignment, fused_experts_token_major
    from pegainfer.engine.kernels.moe_route import fused_route
    tokens, k, n_exp, kw = case
    gate = torch.randn(n_exp, H, generator=gen)
    shard = _shard(gen, n_exp)
    xb = torch.randn(tokens, H, generator=gen)
    al = Alignment.empty(tokens, k, torch.zeros(n_exp, dtype=torch.int64), torch.zeros(1, dtype=torch.int32))
    wb, eb = fused_route(xb, gate, top_k=k, aligned=al, **kw)
    pb = RoutePlan.build(wb, eb.long(), n_exp)
    got_b = fused_experts_token_major(xb, shard.w13[0], shard.w2[0], wb, al, TILINGS.tiling_for(tokens * k))
    want_b = shard.run(0, xb, pb.token_index, pb.weight, pb.expert_counts.tolist())
    assert torch.allclose(got_b, pb.token_major(want_b), atol=1e-5)


def test_tiling_follows_the_steps_routes():
    few = TILINGS.few_rows
    assert TILINGS.tiling_for(6) == Tiling(block_m=16, num_stages=4, up_n=32)  # one token's routes
    assert TILINGS.tiling_for(9) == few == Tiling(block_m=16) and TILINGS.tiling_for(512) == few
    assert TILINGS.tiling_for(513) == TILINGS.tiling == Tiling()
    assert TILINGS.tiling_for(6) is TILINGS.tiling_for(8)  # made once


def test_dense_swiglu_is_one_expert_holding_every_row(triton_interpreter, gen):
    from pegainfer.engine.kernels.moe_experts import DenseRows, dense_swiglu
    x = torch.randn(T, H, generator=gen)
    gate_up = torch.randn(2 * I, H, generator=gen)
    rows = DenseRows()
    for t in (1, 5):
        want_d = F.silu(x[:t] @ gate_up[:I].T) * (x[:t] @ gate_up[I:].T)
        got_d = dense_swiglu(x[:t], gate_up, rows(t, x.device), Tiling(block_m=16, up_n=16, block_k=32))
        assert torch.allclose(got_d, want_d, atol=1e-4), (got_d - want_d).abs().max()
        assert rows(t, x.device) is rows(t, x.device)  # made once per row count


@pytest.mark.parametrize("inter", [2816, 10944])
@pytest.mark.parametrize("rows", [1, 4, 16])
def test_gpu_dense_swiglu_matches_cublas_and_the_swiglu_launch(triton_gpu, inter, rows):
    from pegainfer.engine.cuda_graphs import capture
    from pegainfer.engine.kernels.moe_experts import DenseRows, dense_swiglu
    from pegainfer.engine.kernels.swiglu import swiglu
    tiling = KernelConfig().dense
    g = torch.Generator(device="cuda").manual_seed(rows)
    w = (torch.randn(2 * inter, 2048, device="cuda", generator=g) * 0.02).bfloat16()
    x = torch.randn(rows, 2048, device="cuda", generator=g).bfloat16()
    want = swiglu(F.linear(x, w)).float()
    al = DenseRows()
    got = dense_swiglu(x, w, al(rows, x.device), tiling)
    assert float((got.float() - want).norm() / want.norm()) < 1e-2
    graph, out = capture(lambda: dense_swiglu(x, w, al(rows, x.device), tiling), None)
    for _ in range(20):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, got)
