"""The row kernels of engine/kernels/moe_experts.py on CUDA at lite's shapes, skipped without a GPU:
one token's six routes against the 16-row tl.dot kernels, and the shared experts as one expert
(dense_row) against cuBLAS's F.linear path, in bf16 (another summation order: a relative error of
a rounding step), and the same bits on each of 300 replays of a CUDA graph.
Run on a GPU machine: pytest tests/engine/test_gpu_row_experts.py"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _replays_equal(fn, want: torch.Tensor) -> None:
    from engine.cuda_graphs import capture
    graph, out = capture(fn, None)
    for _ in range(300):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)


def test_row_kernels_match_the_dot_kernels_and_cublas():
    from engine.kernels import moe_experts
    from engine.kernels.moe_route import fused_route
    from engine.kernels.ticket import tickets
    g = torch.Generator(device="cuda").manual_seed(0)
    bf, dev = torch.bfloat16, "cuda"
    e, h, i, k = 64, 2048, 1408, 6
    w13 = (torch.randn(e, 2 * i, h, device=dev, generator=g) * 0.02).to(bf)
    w2 = (torch.randn(e, h, i, device=dev, generator=g) * 0.02).to(bf)
    gate = torch.randn(e, h, device=dev, generator=g) * 0.02
    x = torch.randn(1, h, device=dev, generator=g).to(bf)
    al = moe_experts.Alignment.empty(1, k, torch.zeros(e, dtype=torch.int64, device=dev), tickets(1, dev))
    wts, _ = fused_route(x, gate, top_k=k, aligned=al)

    def routed(tiling):
        return moe_experts.fused_experts_token_major(x, w13, w2, wts, al, tiling=tiling)
    rows, dot = routed(moe_experts.ROW_TILING), routed(moe_experts.FEW_ROWS_TILING)
    assert float((rows - dot).norm() / dot.norm()) < 1e-2
    _replays_equal(lambda: routed(moe_experts.ROW_TILING), rows)

    gate_up = (torch.randn(2 * 2 * i, h, device=dev, generator=g) * 0.02).to(bf)  # the shared experts: I = 2816
    down = (torch.randn(h, 2 * i, device=dev, generator=g) * 0.02).to(bf)
    route = moe_experts.one_row_route(dev)
    got = moe_experts.dense_row(x, gate_up, down, route)
    act = F.silu(F.linear(x, gate_up[:2 * i])) * F.linear(x, gate_up[2 * i:])
    want = F.linear(act, down)
    assert got.dtype == bf and float((got.float() - want.float()).norm() / want.float().norm()) < 1e-2
    _replays_equal(lambda: moe_experts.dense_row(x, gate_up, down, route), got)
