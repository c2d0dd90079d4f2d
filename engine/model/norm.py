"""The model's RMSNorm in its two forms: the reference's torch ops, and the Triton kernels that also
add the residual stream's delta (engine/kernels/rmsnorm.py), which the decode step uses with the
Triton kernels."""
from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """As the reference: normalise in float32, cast back, then scale."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def add_norm(delta, weight: torch.Tensor, x: torch.Tensor, eps: float, fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream's next value and its RMSNorm: x [T, H] plus delta (None, a [T, H] tensor,
    or, fused only, a MoE layer's (routed [T, k, H] float32, shared [T, H]) added in route order) ->
    (norm(x + delta) * weight, x + delta). fused: one Triton launch (engine/kernels/rmsnorm.py);
    otherwise the torch add and the reference's norm."""
    if fused:
        from pegainfer.engine.kernels.rmsnorm import moe_rmsnorm, rmsnorm
        if delta is None:
            return rmsnorm(x, weight, eps)
        if isinstance(delta, tuple):
            return moe_rmsnorm(*delta, weight, eps, residual=x)
        return rmsnorm(delta, weight, eps, residual=x)
    if delta is not None:
        x = x + delta
    return rms_norm(x, weight, eps), x
