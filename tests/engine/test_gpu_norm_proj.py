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


def test_norm_proj_with_the_prep_tails_matches_mla_prep():
    """At lite's shapes, MLA's prep step in the launch's tails (FUSED_PREP) against the launch
    without it then mla_prep: the absorbed query and the cache entry to bf16 rounding (another order
    of sums), nothing else of the cache written, the same bits on each of 300 graph replays, the
    tickets back at zero."""
    from engine.cuda_graphs import capture
    from engine.kernels.mla_prep import Prep, mla_prep
    from engine.kernels.norm_proj import norm_proj
    from engine.kernels.ticket import tickets
    g = torch.Generator(device="cuda").manual_seed(1)
    bf = torch.bfloat16
    w = (torch.randn(3648, 2048, device="cuda", generator=g) * 0.02).to(bf)
    nw = (1 + 0.1 * torch.randn(2048, device="cuda", generator=g)).to(bf)
    res = torch.randn(1, 2048, device="cuda", generator=g).to(bf)
    moe = (torch.randn(1, 6, 2048, device="cuda", generator=g), torch.randn(1, 2048, device="cuda", generator=g).to(bf))
    w_uk = (torch.randn(16, 128, 512, device="cuda", generator=g) * 0.05).to(bf)
    kv_norm = (1 + 0.1 * torch.randn(512, device="cuda", generator=g)).to(bf)
    table = torch.polar(torch.ones(512, 32, device="cuda"), torch.randn(512, 32, device="cuda", generator=g))
    pos, slot = torch.tensor([300], device="cuda"), torch.tensor([3], device="cuda")
    cache_ref = torch.zeros(4, 512, 576, device="cuda", dtype=bf)
    cache_got = cache_ref.clone()
    qkv, x_ref = norm_proj(moe, res, nw, 1e-6, w)
    q_ref = mla_prep(qkv[:, :3072], qkv[:, 3072:], kv_norm, w_uk, table, pos, slot, cache_ref).float()
    tk = tickets(17, "cuda")
    prep = Prep(w_uk, kv_norm, table, pos, slot, cache_got, tk)
    q_got, x_got = norm_proj(moe, res, nw, 1e-6, w, prep=prep)
    torch.cuda.synchronize()
    assert torch.equal(x_got, x_ref) and not tk.any()
    assert float((q_got.float() - q_ref).norm() / q_ref.norm()) < 1e-2
    entry_ref, entry = cache_ref[3, 300].float(), cache_got[3, 300].float()
    assert float((entry - entry_ref).norm() / entry_ref.norm()) < 1e-2
    cache_got[3, 300] = 0
    assert not cache_got.any()
    graph, out = capture(lambda: norm_proj(moe, res, nw, 1e-6, w, prep=prep), None)
    for _ in range(300):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out[0], q_got) and not tk.any()
    assert torch.equal(cache_got[3, 300].float(), entry)
