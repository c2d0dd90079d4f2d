"""engine/kernels/rmsnorm.py: the fused (residual add +) RMSNorm, and a MoE layer's combine folded into
the next norm, compute the reference's norm (Triton's CPU interpreter here; compiled on the GPU)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.engine.model.norm import rms_norm  # noqa: E402


def test_rmsnorm_with_and_without_the_residual_add(triton_interpreter, gen):
    from pegainfer.engine.kernels.rmsnorm import rmsnorm
    x = torch.randn(5, 96, generator=gen)
    r = torch.randn(5, 96, generator=gen)
    w = 1 + 0.1 * torch.randn(96, generator=gen)
    out, res = rmsnorm(x, w, 1e-6, residual=r)
    assert torch.allclose(res, x + r, atol=1e-6)
    assert torch.allclose(out, rms_norm(x + r, w, 1e-6), atol=1e-5), (out - rms_norm(x + r, w, 1e-6)).abs().max()
    out, same = rmsnorm(x, w, 1e-6)
    assert same is x or torch.equal(same, x)
    assert torch.allclose(out, rms_norm(x, w, 1e-6), atol=1e-5)


def test_moe_combine_folded_into_the_next_norm(triton_interpreter, gen):
    """routed [T, k, H] float32 per route, summed in route order, plus the shared experts and the
    residual: the combine's sum and the reference norm of it."""
    from pegainfer.engine.kernels.rmsnorm import moe_rmsnorm
    t, k, h = 5, 4, 48
    routed = torch.randn(t, k, h, generator=gen)
    shared = torch.randn(t, h, generator=gen)
    resid = torch.randn(t, h, generator=gen)
    nw = 1 + 0.1 * torch.randn(h, generator=gen)
    out, res = moe_rmsnorm(routed, shared, nw, 1e-6, residual=resid)
    combined = routed[:, 0].clone()
    for j in range(1, k):  # the fixed-order combine: route 0, then 1, ...
        combined += routed[:, j]
    delta = combined + shared
    assert torch.allclose(res, resid + delta, atol=1e-5)
    assert torch.allclose(out, rms_norm(resid + delta, nw, 1e-6), atol=1e-5)
