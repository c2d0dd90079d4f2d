"""The LM head's logits in float32 (KernelConfig.float32_logits, the default): in a bfloat16 engine
the logits are the float32 sums of the bf16 products, not rounded to bf16 first, so candidates within
one bf16 step of each other keep their order; the opt-out gives model-dtype logits as before. A
request's tokens and log-probs follow from those logits on every path (eager prompt step, decode)."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.kernels.config import KernelConfig
from pegainfer.engine.model.norm import rms_norm


@pytest.fixture(scope="module", params=[True, False], ids=["float32-logits", "rounded"])
def engine(request, tiny_model_dir):
    e = build_engine(EngineSpec(model_dir=str(tiny_model_dir), dtype="bfloat16", num_slots=4, max_model_len=64,
                                kernels=KernelConfig(float32_logits=request.param)))
    yield e
    e.close()


def test_the_head_gives_float32_sums_or_model_dtype_logits(engine):
    m = engine.model
    want = torch.float32 if m.kernels.float32_logits else torch.bfloat16
    assert m.logits_dtype == want
    x = torch.randn(5, m.cfg.hidden_size, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    got = m.head(x)
    assert got.dtype == want and got.shape == (5, m.cfg.vocab_size)
    h = rms_norm(x, m.norm, m.cfg.rms_norm_eps, m.kernels)
    exact = F.linear(h.float(), m.lm_head.float())  # the sums of the bf16 products
    if m.kernels.float32_logits:
        assert (got - exact).abs().max() <= 1e-5 * exact.abs().max()
    else:
        assert torch.equal(got, got.float().to(torch.bfloat16))
        assert (got.float() - exact).abs().max() <= 1e-2 * exact.abs().max()


def test_the_default_keeps_float32_logits():
    assert KernelConfig().float32_logits
    assert dataclasses.replace(KernelConfig(), float32_logits=False).on_device(False, True, False).float32_logits is False
