"""A dense SwiGLU MLP's gate and up projections in one launch (engine/kernels/moe_experts.py
dense_swiglu) on CUDA at lite's shared-expert and dense-layer shapes, skipped without a GPU:
against cuBLAS and the SwiGLU launch in bf16 (a different K order, so to bf16 rounding), and the
same bits on every replay of a CUDA graph.
Run on a GPU machine: pytest tests/engine/test_gpu_dense_swiglu.py"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("inter", [2816, 10944])
@pytest.mark.parametrize("rows", [1, 4, 16])
def test_dense_swiglu_matches_cublas_and_the_swiglu_launch(inter, rows):
    from engine.cuda_graphs import capture
    from engine.kernels.moe_experts import DenseRows, dense_swiglu
    from engine.kernels.swiglu import swiglu
    g = torch.Generator(device="cuda").manual_seed(rows)
    w = (torch.randn(2 * inter, 2048, device="cuda", generator=g) * 0.02).bfloat16()
    x = torch.randn(rows, 2048, device="cuda", generator=g).bfloat16()
    want = swiglu(F.linear(x, w)).float()
    al = DenseRows()
    got = dense_swiglu(x, w, al(rows, x.device))
    assert float((got.float() - want).norm() / want.norm()) < 1e-2
    graph, out = capture(lambda: dense_swiglu(x, w, al(rows, x.device)), None)
    for _ in range(20):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, got)


@pytest.mark.parametrize("rows", [1, 8])
def test_the_l2_prefetch_leaves_the_expert_kernels_bits_alone(monkeypatch, rows):
    """Routed experts at lite's shapes (64 experts, 6 routes a row) and the one-launch SwiGLU, with
    their weight rows asked of L2 first and without: the same bits (a prefetch writes nothing)."""
    from engine.kernels import moe_experts
    from engine.kernels.moe_route import fused_route
    g = torch.Generator(device="cuda").manual_seed(rows)
    bf = torch.bfloat16
    x = torch.randn(rows, 2048, device="cuda", generator=g).to(bf)
    gate = torch.randn(64, 2048, device="cuda", generator=g)
    w13 = (torch.randn(64, 2816, 2048, device="cuda", generator=g) * 0.02).to(bf)
    w2 = (torch.randn(64, 2048, 1408, device="cuda", generator=g) * 0.02).to(bf)
    shared = (torch.randn(5632, 2048, device="cuda", generator=g) * 0.02).to(bf)
    totals = torch.zeros(64, dtype=torch.int64, device="cuda")
    al = moe_experts.Alignment.empty(rows, 6, totals)
    weights, _ = fused_route(x, gate, top_k=6, aligned=al)
    outs = []
    for on in (False, True):
        monkeypatch.setattr(moe_experts, "EXPERT_PREFETCH", on)
        monkeypatch.setattr(moe_experts, "DENSE_PREFETCH", on)
        routed = moe_experts.fused_experts_token_major(x, w13, w2, weights, al)
        dense = moe_experts.dense_swiglu(x, shared, moe_experts.DenseRows()(rows, x.device))
        torch.cuda.synchronize()
        outs.append((routed, dense))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert outs[0][0].abs().sum() > 0
