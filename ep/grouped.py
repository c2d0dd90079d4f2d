"""Grouped expert GEMMs without host synchronisation: rows sorted by expert, one grouped matrix
product per projection, torch._grouped_mm in one launch where it runs (bf16 on Hopper-class CUDA
devices). Elsewhere ExpertShard.run loops over experts instead."""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def grouped_mm_available(device: torch.device) -> bool:
    """True where torch._grouped_mm runs bf16 on this device (checked once per device)."""
    if device.type != "cuda" or not hasattr(torch, "_grouped_mm"):
        return False
    try:
        x = torch.randn(8, 64, device=device, dtype=torch.bfloat16)
        w = torch.randn(2, 32, 64, device=device, dtype=torch.bfloat16)
        offs = torch.tensor([3, 8], device=device, dtype=torch.int32)
        got = torch._grouped_mm(x, w.transpose(1, 2), offs=offs)
        want = torch.cat([x[:3] @ w[0].T, x[3:] @ w[1].T])
        return bool(torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2))
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def grouped_linear(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """x: [M, K] rows sorted by group; w: [G, N, K] (HF [out, in] per group); offs: [G] int32
    cumulative row ends. Returns [M, N] with row m multiplied by its group's weight."""
    return torch._grouped_mm(x, w.transpose(1, 2), offs=offs)
