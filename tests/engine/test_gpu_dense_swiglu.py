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
