"""MLA decode attention in one pass (engine/kernels/mla_decode.py _one_pass_kernel: no splits, no
merge launch, W_UV applied) on CUDA at lite's shapes, skipped without a GPU: against the split and
merge kernels in bf16 (another order of sums, so to bf16 rounding) at context lengths from 1 to the
one-pass bound, and the same bits on every replay of a CUDA graph.
Run on a GPU machine: pytest tests/engine/test_gpu_mla_one_pass.py"""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("rows", [1, 4])
def test_one_pass_matches_split_and_merge(rows):
    from engine.cuda_graphs import capture
    from engine.kernels.mla_decode import ONE_PASS_MAX_LENGTH, mla_decode
    g = torch.Generator(device="cuda").manual_seed(rows)
    bf = torch.bfloat16
    cache = torch.randn(8, ONE_PASS_MAX_LENGTH, 576, device="cuda", generator=g).to(bf)
    q = (torch.randn(rows, 16, 576, device="cuda", generator=g) * 0.1).to(bf)
    w_uv = (torch.randn(16, 512, 128, device="cuda", generator=g) * 0.05).to(bf)
    slots = torch.arange(rows, device="cuda") + 2
    lens = torch.tensor([1, 150, ONE_PASS_MAX_LENGTH, 77][:rows], device="cuda")
    args = (q, cache, slots, lens, ONE_PASS_MAX_LENGTH, 0.07, 512)
    want = mla_decode(*args, w_uv_t=w_uv, one_pass=False).float()
    got = mla_decode(*args, w_uv_t=w_uv, one_pass=True)
    for b in range(rows):
        assert float((got[b].float() - want[b]).norm() / want[b].norm()) < 1e-2, b
    graph, out = capture(lambda: mla_decode(*args, w_uv_t=w_uv, one_pass=True), None)
    for _ in range(20):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, got)
