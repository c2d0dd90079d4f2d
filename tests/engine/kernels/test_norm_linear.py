"""engine/kernels/norm_linear.py: batch-invariant mode's layer input and MLA output at one row, one
launch each. norm_linear's output is bit for bit the multi-row path's, the dot-product norm
(dot_norm) followed by the invariant linear (triton_linear) with the same LinearTiling, for every
residual add (none, a delta, a MoE layer's routes plus its shared experts) and the first layer's
embedding row; linear_norm's is triton_linear's followed by dot_norm's, its ticket back at zero;
dot_norm's rows do not depend on the rows beside them and stay within rounding of the norm kernel
(Triton's interpreter, float32 and bfloat16 as the GPU rounds). On the GPU the same at lite's
shapes, replayed in a CUDA graph (tests/engine/test_gpu_norm_linear.py: an engine with them on)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.engine.kernels.config import LinearTiling  # noqa: E402

TILINGS = [LinearTiling(), LinearTiling(block_k=32, k_chunk=64)]  # 200 = 6 blocks of 32 + 8: a ragged K


def _inputs(gen, dt, hid: int = 200, n: int = 37, rows: int = 1, device: str = "cpu"):
    w = (torch.randn(n, hid, generator=gen) / 8).to(dt).to(device)
    nw = (1 + 0.1 * torch.randn(hid, generator=gen)).to(dt).to(device)
    res = torch.randn(rows, hid, generator=gen).to(dt).to(device)
    dense = torch.randn(rows, hid, generator=gen).to(dt).to(device)
    moe = (torch.randn(rows, 3, hid, generator=gen).to(device), torch.randn(rows, hid, generator=gen).to(dt).to(device))
    return w, nw, res, (None, dense, moe)


def _check_one_row(w, nw, res, deltas, tiling, block_n=16):
    from pegainfer.engine.kernels.linear import triton_linear
    from pegainfer.engine.kernels.norm_linear import dot_norm, norm_linear
    from pegainfer.engine.kernels.rmsnorm import moe_rmsnorm, rmsnorm
    for delta in deltas:
        h, x = dot_norm(delta, res, nw, 1e-6, tiling)
        got, x_got = norm_linear(delta, res, nw, 1e-6, w, tiling, block_n=block_n)
        assert torch.equal(x_got, x) and torch.equal(got, triton_linear(h, w, tiling)), (type(delta), tiling)
        # the norm kernel's residual bits, its normalised row within rounding (another order of sums)
        ref_h, ref_x = (rmsnorm(res, nw, 1e-6) if delta is None else moe_rmsnorm(*delta, nw, 1e-6, residual=res)
                        if isinstance(delta, tuple) else rmsnorm(delta, nw, 1e-6, residual=res))
        assert torch.equal(x, ref_x)
        tol = 1e-5 if res.dtype == torch.float32 else 2e-2
        assert torch.allclose(h.float(), ref_h.float(), rtol=tol, atol=tol)
        assert torch.allclose(got.float(), F.linear(ref_h.float(), w.float()), rtol=tol, atol=tol)


def test_one_launch_is_the_dot_norm_then_the_invariant_linear_float32(triton_interpreter, gen):
    w, nw, res, deltas = _inputs(gen, torch.float32)
    for tiling in TILINGS:
        for block_n in (16, 32):  # columns a program: no bits change
            _check_one_row(w, nw, res, deltas, tiling, block_n)


def test_one_launch_is_the_dot_norm_then_the_invariant_linear_bfloat16(bf16_as_gpu, gen):
    w, nw, res, deltas = _inputs(gen, torch.bfloat16)
    for tiling in TILINGS:
        _check_one_row(w, nw, res, deltas, tiling)


def test_the_first_layers_form_reads_the_embedding_row(triton_interpreter, gen):
    from pegainfer.engine.kernels.norm_linear import norm_linear
    w, nw, _, deltas = _inputs(gen, torch.float32)
    table, tok = torch.randn(50, 200, generator=gen), torch.tensor([41])
    got, x_got = norm_linear(None, table, nw, 1e-6, w, TILINGS[0], token=tok)
    want, x_want = norm_linear(None, F.embedding(tok, table), nw, 1e-6, w, TILINGS[0])
    assert torch.equal(got, want) and torch.equal(x_got, x_want) and torch.equal(x_got[0], table[41])
    with pytest.raises(ValueError, match="embedding row"):
        norm_linear(deltas[1][:1], table, nw, 1e-6, w, TILINGS[0], token=tok)
    with pytest.raises(ValueError, match="one row"):
        norm_linear(None, torch.randn(2, 200), nw, 1e-6, w, TILINGS[0])


def test_a_rows_dot_norm_does_not_depend_on_the_rows_beside_it(triton_interpreter, gen):
    from pegainfer.engine.kernels.norm_linear import dot_norm
    _, nw, res, deltas = _inputs(gen, torch.float32, rows=5)
    for delta in deltas:
        h, x = dot_norm(delta, res, nw, 1e-6, TILINGS[0])
        for r in (0, 3):
            one = None if delta is None else (delta[0][r:r + 1], delta[1][r:r + 1]) if isinstance(delta, tuple) \
                else delta[r:r + 1]
            h1, x1 = dot_norm(one, res[r:r + 1], nw, 1e-6, TILINGS[0])
            assert torch.equal(h1[0], h[r]) and torch.equal(x1[0], x[r]), (type(delta), r)


def _check_output(v, w, res, nw, tiling):
    from pegainfer.engine.kernels.linear import triton_linear
    from pegainfer.engine.kernels.norm_linear import dot_norm, linear_norm
    from pegainfer.engine.kernels.ticket import tickets
    count = tickets(1, v.device)
    h, x = linear_norm(v, w, res, nw, 1e-6, count, tiling)
    want_h, want_x = dot_norm(triton_linear(v, w, tiling), res, nw, 1e-6, tiling)
    assert torch.equal(h, want_h) and torch.equal(x, want_x) and int(count[0]) == 0, tiling
    return count, want_h


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
def test_the_output_launch_is_the_invariant_linear_then_the_dot_norm(request, triton_interpreter, gen, dt):
    from pegainfer.engine.kernels.norm_linear import linear_norm
    if dt == torch.bfloat16:
        request.getfixturevalue("bf16_as_gpu")
    v, w = torch.randn(1, 300, generator=gen).to(dt), (torch.randn(200, 300, generator=gen) / 8).to(dt)
    res, nw = torch.randn(1, 200, generator=gen).to(dt), (1 + 0.1 * torch.randn(200, generator=gen)).to(dt)
    for tiling in TILINGS:
        count, _ = _check_output(v, w, res, nw, tiling)
    for bad in ({"v": torch.randn(2, 300).to(dt)}, {"res": torch.randn(1, 199).to(dt)},
                {"count": count[:0]}, {"w": w.t().contiguous().t()}):
        args = {"v": v, "w": w, "res": res, "count": count, **bad}
        with pytest.raises(ValueError, match="one row"):
            linear_norm(args["v"], args["w"], args["res"], nw, 1e-6, args["count"], TILINGS[0])
    with pytest.raises(ValueError, match="one dtype"):
        linear_norm(v.to(torch.float64), w, res, nw, 1e-6, count, TILINGS[0])


def test_gpu_one_launch_is_the_dot_norm_then_the_invariant_linear(triton_gpu):
    from pegainfer.engine.cuda_graphs import capture
    from pegainfer.engine.kernels.config import KernelConfig
    from pegainfer.engine.kernels.linear import triton_linear
    from pegainfer.engine.kernels.norm_linear import dot_norm, norm_linear
    g = torch.Generator().manual_seed(3)
    tiling = KernelConfig().linear
    w, nw, res, deltas = _inputs(g, torch.bfloat16, hid=2048, n=3648, device="cuda")
    for i, delta in enumerate(deltas):
        h, x = dot_norm(delta, res, nw, 1e-6, tiling)
        want = triton_linear(h, w, tiling)
        got, x_got = norm_linear(delta, res, nw, 1e-6, w, tiling)
        assert torch.equal(got, want) and torch.equal(x_got, x), type(delta)
        # the claim itself: the lone row's launch gives its row of a crowd's dot_norm + triton_linear,
        # 16-row blocks at 64 rows, 64-row blocks (wgmma) from wide_rows (256) on
        for rows in (64, 300):
            _, _, crowd_res, crowd_deltas = _inputs(g, torch.bfloat16, hid=2048, n=3648, rows=rows, device="cuda")
            crowd_res[7] = res[0]
            d = crowd_deltas[i]  # the same form of residual add, the probe's at row 7
            if isinstance(delta, tuple):
                d[0][7], d[1][7] = delta[0][0], delta[1][0]
            elif delta is not None:
                d[7] = delta[0]
            assert torch.equal(triton_linear(dot_norm(d, crowd_res, nw, 1e-6, tiling)[0], w, tiling)[7], got[0]), rows
        graph, out = capture(lambda d=delta: norm_linear(d, res, nw, 1e-6, w, tiling)[0], None)
        for _ in range(20):
            out.fill_(float("nan"))
            graph.replay()
            assert torch.equal(out, want), type(delta)


def test_gpu_the_output_launch_is_the_invariant_linear_then_the_dot_norm(triton_gpu):
    from pegainfer.engine.cuda_graphs import capture
    from pegainfer.engine.kernels.config import KernelConfig
    from pegainfer.engine.kernels.norm_linear import linear_norm
    g = torch.Generator().manual_seed(4)
    tiling = KernelConfig().linear
    v = torch.randn(1, 2048, generator=g).to(torch.bfloat16).cuda()  # 16 heads x 128 values
    w = (torch.randn(2048, 2048, generator=g) / 32).to(torch.bfloat16).cuda()
    res = torch.randn(1, 2048, generator=g).to(torch.bfloat16).cuda()
    nw = (1 + 0.1 * torch.randn(2048, generator=g)).to(torch.bfloat16).cuda()
    count, want = _check_output(v, w, res, nw, tiling)
    from pegainfer.engine.kernels.linear import triton_linear
    from pegainfer.engine.kernels.norm_linear import dot_norm
    for rows in (64, 300):  # the row in crowds: 16-row blocks, then 64-row blocks (wgmma) from 256 rows
        vs = torch.randn(rows, 2048, generator=g).to(torch.bfloat16).cuda()
        rs = torch.randn(rows, 2048, generator=g).to(torch.bfloat16).cuda()
        vs[5], rs[5] = v[0], res[0]
        assert torch.equal(dot_norm(triton_linear(vs, w, tiling), rs, nw, 1e-6, tiling)[0][5], want[0]), rows
    graph, out = capture(lambda: linear_norm(v, w, res, nw, 1e-6, count, tiling)[0], None)
    for i in range(20):  # other inputs each replay: a stale output or a ticket left behind would show
        v.copy_(torch.randn(1, 2048, generator=g).to(torch.bfloat16))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        fresh = dot_norm(triton_linear(v, w, tiling), res, nw, 1e-6, tiling)[0]
        assert int(count[0]) == 0 and torch.equal(out, fresh), i
