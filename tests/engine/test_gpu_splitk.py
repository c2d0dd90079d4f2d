"""o_proj as split-K partial sums on CUDA (skipped without a GPU): the Triton kernel at the lite
o_proj shape against F.linear, and the fused decode step at 1, 3 and 4 rows (where o_proj's
partials are added up inside the next norm) against the same step with cuBLAS's o_proj (bf16,
so within rounding, not bit for bit). Run on a GPU machine: pytest tests/engine/test_gpu_splitk.py"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.decode import DecodeInputs, decode_logits
from engine.engine import EngineSpec, build_engine

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


@pytest.mark.parametrize("rows", [1, 3, 4])
def test_decode_step_with_split_o_proj_matches_cublas(rows, monkeypatch):
    from engine.kernels import gemv
    engine = build_engine(EngineSpec(random_preset="tiny", device="cuda:0", dtype="bfloat16", num_slots=8))
    try:
        model, cache = engine.model, engine.cache
        assert model.fused_kernels
        dev = cache.data.device
        pos = torch.tensor([5, 17, 2, 40][:rows], device=dev)
        inp = DecodeInputs(torch.tensor([3, 99, 250, 7][:rows], device=dev), pos,
                           torch.arange(rows, device=dev), pos + 1, length=64)
        saved = cache.data.clone()
        split = decode_logits(model, inp, cache).float()
        cache.data.copy_(saved)
        monkeypatch.setattr(gemv, "MAX_ROWS", 0)  # every o_proj through F.linear
        plain = decode_logits(model, inp, cache).float()
        assert (split - plain).norm() <= 0.02 * plain.norm(), (split - plain).norm() / plain.norm()
    finally:
        engine.close()
