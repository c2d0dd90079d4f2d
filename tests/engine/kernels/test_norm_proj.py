"""engine/kernels/norm_proj.py: the layer's input in one launch, the residual add (none, a delta, or a
MoE layer's routes in order plus its shared experts), the norm and the q/kv_a projection, against the
norm kernels and F.linear, for a width that is not a multiple of the block, K in chunks or in one
tile; the first layer's form reads the embedding row itself (Triton's CPU interpreter). On the GPU
at lite's q/kv_a shape against the norm kernel and cuBLAS's GEMV in bf16 (the residual row bit for
bit), and the same bits on each of 300 replays of a CUDA graph (every program normalises the row the
same way)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.engine.kernels.config import KernelConfig, RowTiling  # noqa: E402


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
def test_norm_proj_is_the_norm_then_the_projection(triton_interpreter, gen, dt):
    from pegainfer.engine.kernels.norm_proj import norm_proj
    from pegainfer.engine.kernels.rmsnorm import moe_rmsnorm, rmsnorm
    hid, n = 200, 37
    w = (torch.randn(n, hid, generator=gen) / 8).to(dt)
    nw = (1 + 0.1 * torch.randn(hid, generator=gen)).to(dt)
    res = torch.randn(1, hid, generator=gen).to(dt)
    dense = torch.randn(1, hid, generator=gen).to(dt)
    moe = (torch.randn(1, 3, hid, generator=gen), torch.randn(1, hid, generator=gen).to(dt))
    for delta in (None, dense, moe):
        if delta is None:
            h_ref, x_ref = rmsnorm(res, nw, 1e-6)
        elif isinstance(delta, tuple):
            h_ref, x_ref = moe_rmsnorm(*delta, nw, 1e-6, residual=res)
        else:
            h_ref, x_ref = rmsnorm(delta, nw, 1e-6, residual=res)
        for block_k in (64, 256):  # K in chunks; the whole row in one tile (loaded before the norm)
            got, x_got = norm_proj(delta, res, nw, 1e-6, w, RowTiling(16, block_k))
            want = F.linear(h_ref.float(), w.float())
            assert torch.equal(x_got, x_ref), (dt, type(delta))
            tol = 1e-5 if dt == torch.float32 else 2e-2
            assert got.shape == (1, n) and got.dtype == dt and torch.allclose(got.float(), want, rtol=tol, atol=tol), (
                dt, type(delta), block_k, (got.float() - want).abs().max())
    # the first layer's form: the row read from the embedding table by the token id, the same bits as
    # F.embedding then the launch; a delta beside a token is refused
    table = torch.randn(50, hid, generator=gen).to(dt)  # [V, K]
    tok = torch.tensor([41])
    for block_k in (64, 256):
        tiling = RowTiling(16, block_k)
        got, x_got = norm_proj(None, table, nw, 1e-6, w, tiling, token=tok)
        want, x_want = norm_proj(None, F.embedding(tok, table), nw, 1e-6, w, tiling)
        assert torch.equal(x_got, x_want) and torch.equal(got, want) and torch.equal(x_got[0], table[41]), (dt, block_k)
    with pytest.raises(ValueError, match="embedding row"):
        norm_proj(dense, table, nw, 1e-6, w, tiling, token=tok)


def test_gpu_norm_proj_matches_the_norm_kernel_and_cublas(triton_gpu):
    from pegainfer.engine.cuda_graphs import capture
    from pegainfer.engine.kernels.norm_proj import norm_proj
    from pegainfer.engine.kernels.rmsnorm import moe_rmsnorm, rmsnorm
    tiling = KernelConfig().norm_proj
    g = torch.Generator(device="cuda").manual_seed(0)
    bf = torch.bfloat16
    w = (torch.randn(3648, 2048, device="cuda", generator=g) * 0.02).to(bf)
    nw = (1 + 0.1 * torch.randn(2048, device="cuda", generator=g)).to(bf)
    res = torch.randn(1, 2048, device="cuda", generator=g).to(bf)
    dense = torch.randn(1, 2048, device="cuda", generator=g).to(bf)
    moe = (torch.randn(1, 6, 2048, device="cuda", generator=g), torch.randn(1, 2048, device="cuda", generator=g).to(bf))
    for delta, (h_ref, x_ref) in ((None, rmsnorm(res, nw, 1e-6)), (dense, rmsnorm(dense, nw, 1e-6, residual=res)),
                                  (moe, moe_rmsnorm(*moe, nw, 1e-6, residual=res))):
        got, x = norm_proj(delta, res, nw, 1e-6, w, tiling)
        want = F.linear(h_ref, w)
        assert torch.equal(x, x_ref)
        assert float((got.float() - want.float()).norm() / want.float().norm()) < 1e-2
        graph, out = capture(lambda d=delta: norm_proj(d, res, nw, 1e-6, w, tiling), None)
        for _ in range(300):
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out[0], got)


def test_gpu_first_layer_reads_the_embedding_row_itself(triton_gpu):
    # the token's row of lite's embedding table, the same bits as F.embedding then the launch, and
    # the same bits on each graph replay with a new token written into the graph's input
    from pegainfer.engine.cuda_graphs import capture
    from pegainfer.engine.kernels.norm_proj import norm_proj
    tiling = KernelConfig().norm_proj
    g = torch.Generator(device="cuda").manual_seed(1)
    bf = torch.bfloat16
    table = torch.randn(102400, 2048, device="cuda", generator=g).to(bf)  # [V, H]
    w = (torch.randn(3648, 2048, device="cuda", generator=g) * 0.02).to(bf)
    nw = (1 + 0.1 * torch.randn(2048, device="cuda", generator=g)).to(bf)
    tok = torch.tensor([7], device="cuda")
    graph, out = capture(lambda: norm_proj(None, table, nw, 1e-6, w, tiling, token=tok), None)
    for t in (7, 102399, 0, 5000):
        tok.fill_(t)
        graph.replay()
        torch.cuda.synchronize()
        want, x_want = norm_proj(None, F.embedding(tok, table), nw, 1e-6, w, tiling)
        assert torch.equal(out[1], x_want) and torch.equal(out[0], want) and torch.equal(out[1][0], table[t]), t
