"""The layer's input in one launch (engine/kernels/norm_proj.py) on CUDA at lite's q/kv_a shape,
skipped without a GPU: a MoE layer's combine, the residual add, the norm and the projection against
the norm kernel and cuBLAS's GEMV in bf16 (the residual row bit for bit), and the same bits on each
of 300 replays of a CUDA graph (every program normalises the row the same way).
Run on a GPU machine: pytest tests/engine/test_gpu_norm_proj.py"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_norm_proj_matches_the_norm_kernel_and_cublas():
    from engine.cuda_graphs import capture
    from engine.kernels.norm_proj import norm_proj
    from engine.kernels.rmsnorm import moe_rmsnorm, rmsnorm
    g = torch.Generator(device="cuda").manual_seed(0)
    bf = torch.bfloat16
    w = (torch.randn(3648, 2048, device="cuda", generator=g) * 0.02).to(bf)
    nw = (1 + 0.1 * torch.randn(2048, device="cuda", generator=g)).to(bf)
    res = torch.randn(1, 2048, device="cuda", generator=g).to(bf)
    dense = torch.randn(1, 2048, device="cuda", generator=g).to(bf)
    moe = (torch.randn(1, 6, 2048, device="cuda", generator=g), torch.randn(1, 2048, device="cuda", generator=g).to(bf))
    for delta, (h_ref, x_ref) in ((None, rmsnorm(res, nw, 1e-6)), (dense, rmsnorm(dense, nw, 1e-6, residual=res)),
                                  (moe, moe_rmsnorm(*moe, nw, 1e-6, residual=res))):
        got, x = norm_proj(delta, res, nw, 1e-6, w)
        want = F.linear(h_ref, w)
        assert torch.equal(x, x_ref)
        assert float((got.float() - want.float()).norm() / want.float().norm()) < 1e-2
        graph, out = capture(lambda d=delta: norm_proj(d, res, nw, 1e-6, w), None)
        for _ in range(300):
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out[0], got)
