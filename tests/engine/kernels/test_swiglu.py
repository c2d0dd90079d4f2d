"""engine/kernels/swiglu.py: SiLU(gate) * up in one launch over a fused gate-and-up projection is the
two torch ops (Triton's CPU interpreter); in bfloat16 within a rounding step of them (the
interpreter's bfloat16 casts do not round as the GPU's do), on the GPU too (its SiLU is within a
float32 ulp of F.silu's before rounding)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

T, I = 5, 40


def test_swiglu_is_silu_times_up(triton_interpreter, gen):
    from pegainfer.engine.kernels.swiglu import swiglu
    gu = torch.randn(T, 2 * I, generator=gen)
    assert torch.allclose(swiglu(gu), F.silu(gu[:, :I]) * gu[:, I:], atol=1e-6)
    gb = gu.bfloat16()
    want_b = (F.silu(gb[:, :I]) * gb[:, I:]).float()
    assert ((swiglu(gb).float() - want_b).abs() <= want_b.abs() / 64 + 1e-3).all()


def test_gpu_swiglu_rounds_as_the_torch_ops(triton_gpu):
    from pegainfer.engine.kernels.swiglu import swiglu
    g = torch.Generator(device="cuda").manual_seed(0)
    for rows, inter in ((1, 1408), (64, 10944)):
        gu = torch.randn(rows, 2 * inter, device="cuda", generator=g).bfloat16()
        want = (F.silu(gu[:, :inter]) * gu[:, inter:]).float()
        assert ((swiglu(gu).float() - want).abs() <= want.abs() / 128 + 1e-6).all(), (rows, inter)
