"""engine/kernels/gemv.py: the split-K partial sums (measured by tools/dev/gemv_bench.py, not in the decode
step) add up, in order, to the product: in Triton's CPU interpreter, and at the lite o_proj shape on
a GPU."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")


def test_partial_sums_add_up_to_the_product(triton_interpreter, gen):
    from pegainfer.engine.kernels import gemv
    xs = torch.randn(3, 300, generator=gen)
    wo = torch.randn(96, 300, generator=gen)
    for tiling in (gemv.Tiling(16, 128, 2), gemv.Tiling(32, 64, 4)):  # 4 splits of 75 padded to 128: one runs empty
        parts = gemv.splitk_parts(xs, wo, tiling)
        assert parts.shape == (tiling.split, 3, 96) and torch.allclose(parts.sum(0), xs @ wo.T, atol=1e-4)
    with pytest.raises(ValueError):
        gemv.splitk_parts(torch.randn(5, 300), wo)  # more rows than the kernel keeps in registers


def test_gpu_partial_sums_match_f_linear_at_the_lite_o_proj_shape(triton_gpu):
    from pegainfer.engine.kernels import gemv
    g = torch.Generator(device="cuda").manual_seed(0)
    for rows in (1, 3, 4):
        x = torch.randn(rows, 2048, device="cuda", dtype=torch.bfloat16, generator=g)
        w = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
        ref = F.linear(x.float(), w.float())
        got = gemv.splitk_parts(x, w, gemv.O_PROJ).sum(0)
        assert (got - ref).abs().max() <= 1e-4 * ref.abs().max() + 1e-4
