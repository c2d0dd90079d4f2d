"""engine/kernels/moe_experts.py: the routed experts' SwiGLU MLP as two launches computes what
ExpertShard.run (the per-expert loop, the reference order) computes, in both forms: a shard's routes
in the plan's execution order (what every backend runs, a multi-rank one over rows already gathered)
and every token's routes as the router kernel listed them (the decode step's form); and a dense
SwiGLU's gate and up in one launch. Triton's CPU interpreter, float32; on the GPU the dense form at
lite's shapes against cuBLAS and the SwiGLU launch, and the same bits on every CUDA-graph replay.

Batch invariance: a route's weighted output is the same bits alone and inside crowds of 1 to 256
random tokens (and above ExpertTilings.max_routes, where the fast path hands off to grouped GEMMs),
in both forms, and under every tiling ExpertTilings picks (Triton's interpreter, bfloat16 as the GPU
rounds it; on the GPU at lite's shapes)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.engine.kernels.config import ExpertTilings, KernelConfig, Tiling  # noqa: E402
from pegainfer.ep.experts import ExpertKernel, ExpertShard  # noqa: E402
from pegainfer.ep.plan import RoutePlan  # noqa: E402
from tests.engine.kernels.route_crowds import FEW_SIZES, SIZES, crowd, listing, probe_weights, routes_crowd  # noqa: E402

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
    assert TILINGS.tiling_for(513) == TILINGS.tiling == Tiling() == TILINGS.tiling_for(2048)
    assert TILINGS.tiling_for(2049) == TILINGS.many_rows == Tiling(128, 128, 64, 128, 8, 3)  # prompt-sized steps
    assert ExpertTilings(many_rows_min_routes=0).tiling_for(10**6) == Tiling()  # 0: never the wide tiling
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


def _bf16_shard(gen: torch.Generator, n: int, h: int, i: int, dev="cpu") -> ExpertShard:
    w13 = (torch.randn(n, 2 * i, h, generator=gen) * h ** -0.5).to(torch.bfloat16).to(dev)
    w2 = (torch.randn(n, h, i, generator=gen) * i ** -0.5).to(torch.bfloat16).to(dev)
    return ExpertShard(range(n), {0: w13}, {0: w2})


def _probe_outputs(shard: ExpertShard, rows: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, pos: int,
                   tilings: ExpertTilings = TILINGS, forms=("plan", "token_major")) -> dict:
    """The probe's (row pos) k weighted route outputs [k, H] float32 in each form: a shard's routes in
    the plan's order (every backend, tiling by the step's routes) and token-major over the router's
    listing (the decode step's, up to 1024 tokens)."""
    n_exp = len(shard.experts)
    kernel = ExpertKernel("triton", tilings)
    out = {}
    if "plan" in forms:
        plan = RoutePlan.build(weights, experts, n_exp)
        out["plan"] = plan.token_major(shard.run_routes(0, rows, plan.token_index, plan.weight, plan.expert_counts,
                                                        kernel))[pos]
    if "token_major" in forms and rows.shape[0] <= 1024:
        out["token_major"] = shard.run_token_major(0, rows, weights, listing(experts, n_exp), kernel)[pos]
    return out


def test_a_routes_output_is_batch_invariant(bf16_as_gpu, gen):
    """8 experts, 4 routes a token, H and I two K blocks each: the sizes take all three tilings."""
    h, i, n_exp = 256, 160, 8
    shard = _bf16_shard(gen, n_exp, h, i)
    probe = torch.randn(1, h, generator=gen).to(torch.bfloat16)
    mine = torch.tensor([1, 3, 4, 6])
    alone = _probe_outputs(shard, probe, mine[None], probe_weights(4)[None], 0)
    assert torch.equal(alone["plan"], alone["token_major"])
    for n, size in enumerate(FEW_SIZES):  # the forms in turn (one interpreted program at a time), both at 256
        rows, pos = crowd(probe, size, gen)
        experts, weights = routes_crowd(mine, size, n_exp, pos, gen)
        forms = ("plan", "token_major") if size == FEW_SIZES[-1] else (("plan", "token_major")[n % 2],)
        for form, got in _probe_outputs(shard, rows, experts, weights, pos, forms=forms).items():
            assert torch.equal(got, alone["plan"]), (size, form)


def _every_tiling(tilings: ExpertTilings) -> list[Tiling]:
    """Each tiling tiling_for picks, at any step size."""
    picks = [tilings.tiling_for(n) for n in range(1, 2 * max(tilings.max_routes, tilings.many_rows_min_routes))]
    return list(dict.fromkeys(picks))


def _only(t: Tiling) -> ExpertTilings:
    """Tilings that pick t at every step size."""
    return ExpertTilings(t, t, 0, 0, t.num_stages, t.up_n, many_rows=t)


def test_every_tiling_gives_a_route_the_same_bits(bf16_as_gpu, gen):
    """block_m 16, 32 or 64, 3 or 4 stages, 32, 64 or 128 gate-up columns, 4 or 8 warps: block_k fixes
    every dot product's order, so the same bits (the GPU variant below is the claim; here numpy's)."""
    h, i, n_exp = 256, 160, 8
    shard = _bf16_shard(gen, n_exp, h, i)
    rows = torch.randn(40, h, generator=gen).to(torch.bfloat16)
    experts, weights = routes_crowd(torch.tensor([0, 2, 5, 7]), 40, n_exp, 0, gen)
    tilings = _every_tiling(TILINGS)
    assert len(tilings) == 4 and {t.block_k for t in tilings} == {128}
    outs = [_probe_outputs(shard, rows, experts, weights, slice(None), _only(t)) for t in tilings]
    for t, out in zip(tilings[1:], outs[1:]):
        for form in out:
            assert torch.equal(out[form], outs[0][form]), (t, form)


def test_gpu_a_routes_output_is_batch_invariant(triton_gpu):
    """Lite's experts: a route's bits alone and in crowds of 1 to 256 tokens and above max_routes
    (400 tokens: 2,400 routes, which the fast path hands to grouped GEMMs), in both forms, and as
    an EP rank runs its share (rows gathered, the tiling by the whole step's routes)."""
    g = torch.Generator().manual_seed(0)
    h, i, n_exp, k = 2048, 1408, 64, 6
    shard = _bf16_shard(g, n_exp, h, i, "cuda")
    half = ExpertShard(range(32), {0: shard.w13[0][32:]}, {0: shard.w2[0][32:]})  # a rank owning experts 32..63
    for mine in (torch.tensor([0, 5, 17, 33, 40, 63]), torch.tensor([2, 3, 4, 5, 6, 7])):
        probe = torch.randn(1, h, generator=g).to(torch.bfloat16).cuda()
        mine = mine.cuda()
        alone = _probe_outputs(shard, probe, mine[None], probe_weights(k)[None].cuda(), 0)
        assert torch.equal(alone["plan"], alone["token_major"])
        for size in SIZES + (400, 1024):
            rows, pos = crowd(probe, size, g)
            experts, weights = routes_crowd(mine, size, n_exp, pos, g)
            for form, got in _probe_outputs(shard, rows, experts, weights, pos).items():
                assert torch.equal(got, alone["plan"]), (size, form)
            plan = RoutePlan.build(weights, experts, n_exp)
            counts = plan.expert_counts.tolist()
            lo, hi = plan.span(range(32, 64), counts)
            share = half.run_routes(0, rows[plan.token_index[lo:hi]], torch.arange(hi - lo, device="cuda"),
                                    plan.weight[lo:hi], plan.expert_counts[32:], ExpertKernel("triton"), size * k)
            slots = plan.perm[lo:hi]  # token-major slot of each of the share's routes
            for j in range(k):
                if int(mine[j]) >= 32:
                    got = share[(slots == pos * k + j).nonzero().item()]
                    assert torch.equal(got, alone["plan"][j]), (size, "rank share", j)


def test_gpu_every_tiling_gives_a_route_the_same_bits(triton_gpu):
    """The claim the tiling choice rests on (ExpertTilings.tiling_for by the step's routes): on the
    GPU, 16- and 32-row blocks (one mma instruction shape, m16n8k16, at both), 64- and 128-row blocks
    (wgmma on sm_90), 3 or 4 stages, 32 to 128 gate-up columns and 4 or 8 warps give every route the
    same bits, in both forms, at lite's shapes (the wide tiling's candidates of kernel_bench --sweep
    many included)."""
    g = torch.Generator().manual_seed(1)
    h, i, n_exp = 2048, 1408, 64
    shard = _bf16_shard(g, n_exp, h, i, "cuda")
    tilings = _every_tiling(TILINGS)
    assert len(tilings) == 4
    tilings += [Tiling(64, 128, 64, 128, 8, 4), Tiling(64, 128, 64, 128, 4, 3), Tiling(128, 128, 64, 128, 4, 3)]
    for size in (1, 7, 40, 300, 1200):
        rows = torch.randn(size, h, generator=g).to(torch.bfloat16).cuda()
        experts, weights = routes_crowd(torch.tensor([0, 9, 18, 27, 36, 45]).cuda(), size, n_exp, 0, g)
        outs = [_probe_outputs(shard, rows, experts, weights, slice(None),
                               _only(t)) for t in tilings]
        for t, out in zip(tilings[1:], outs[1:]):
            for form in out:
                assert torch.equal(out[form], outs[0][form]), (size, t, form)
