"""The split-K GEMV kernel (engine/kernels/gemv.py, measured by tools/gemv_bench.py) on CUDA, skipped
without a GPU: at the lite o_proj shape its partial sums add up to F.linear's float32 product.
Run on a GPU machine: pytest tests/engine/test_gpu_splitk.py"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_kernel_matches_f_linear_at_the_lite_o_proj_shape():
    from engine.kernels import gemv
    g = torch.Generator(device="cuda").manual_seed(0)
    for rows in (1, 3, 4):
        x = torch.randn(rows, 2048, device="cuda", dtype=torch.bfloat16, generator=g)
        w = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
        ref = F.linear(x.float(), w.float())
        got = gemv.splitk_parts(x, w, gemv.O_PROJ).sum(0)
        assert (got - ref).abs().max() <= 1e-4 * ref.abs().max() + 1e-4
