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


def test_first_layer_reads_the_embedding_row_itself():
    # the token's row of lite's embedding table, the same bits as F.embedding then the launch, and
    # the same bits on each graph replay with a new token written into the graph's input
    from engine.cuda_graphs import capture
    from engine.kernels.norm_proj import norm_proj
    g = torch.Generator(device="cuda").manual_seed(1)
    bf = torch.bfloat16
    table = torch.randn(102400, 2048, device="cuda", generator=g).to(bf)  # [V, H]
    w = (torch.randn(3648, 2048, device="cuda", generator=g) * 0.02).to(bf)
    nw = (1 + 0.1 * torch.randn(2048, device="cuda", generator=g)).to(bf)
    tok = torch.tensor([7], device="cuda")
    graph, out = capture(lambda: norm_proj(None, table, nw, 1e-6, w, token=tok), None)
    for t in (7, 102399, 0, 5000):
        tok.fill_(t)
        graph.replay()
        torch.cuda.synchronize()
        want, x_want = norm_proj(None, F.embedding(tok, table), nw, 1e-6, w)
        assert torch.equal(out[1], x_want) and torch.equal(out[0], want) and torch.equal(out[1][0], table[t]), t
