"""The model's RMSNorm in its two forms: the reference's torch ops, and the Triton kernels that also
add the residual stream's delta (engine/kernels/rmsnorm.py), which the decode step uses with the
Triton kernels."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pegainfer.engine.kernels.config import KernelConfig


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, kernels: KernelConfig | None = None) -> torch.Tensor:
    """As the reference: normalise in float32, cast back, then scale. With kernels.batch_invariant
    each row's sum of squares is summed in an order fixed by the width: the Triton row kernel on
    CUDA (one program per row), elsewhere a pairwise sum of elementwise adds (a library reduction
    picks its split by the row count: on CUDA a lone row's values are summed by 512 threads, a
    crowd's by 32)."""
    invariant = kernels is not None and kernels.batch_invariant
    if invariant and x.is_cuda and kernels.triton:
        from pegainfer.engine.kernels.rmsnorm import rmsnorm
        return rmsnorm(x, weight, eps)[0]
    return torch_rms_norm(x, weight, eps, invariant)


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, invariant: bool) -> torch.Tensor:
    """The reference's ops; invariant: the sum of squares as pairwise_sum, in an order fixed by the
    width, not the library's mean."""
    dtype = x.dtype
    h = x.float()
    var = pairwise_sum(h * h) / h.shape[-1] if invariant else h.pow(2).mean(-1, keepdim=True)  # [..., 1]
    return weight * (h * torch.rsqrt(var + eps)).to(dtype)


def pairwise_sum(h: torch.Tensor) -> torch.Tensor:
    """[..., K] -> [..., 1]: zeros to a power of two, then halves added until one value is left."""
    k = h.shape[-1]
    if k & (k - 1):
        h = F.pad(h, (0, (1 << k.bit_length()) - k))
    while h.shape[-1] > 1:
        half = h.shape[-1] // 2
        h = h[..., :half] + h[..., half:]
    return h


def add_norm(delta, weight: torch.Tensor, x: torch.Tensor, eps: float, fused: bool,
             kernels: KernelConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
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
    return rms_norm(x, weight, eps, kernels), x
