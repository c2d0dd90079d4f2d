"""Grouped expert GEMMs without host synchronisation: rows sorted by expert, one grouped matrix
product per projection. On Hopper-class CUDA devices torch._grouped_mm does it in one launch; the
fallback loops over experts (it reads the row counts on the host, so it is not graph-safe)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def grouped_mm_available(device: torch.device) -> bool:
    """True where torch._grouped_mm runs bf16 on this device (checked once at start-up)."""
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


def grouped_linear(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, fused: bool) -> torch.Tensor:
    """x: [M, K] rows sorted by group; w: [G, N, K] (HF [out, in] per group); offs: [G] int32
    cumulative row ends. Returns [M, N] with row m multiplied by its group's weight."""
    if fused:
        return torch._grouped_mm(x, w.transpose(1, 2), offs=offs)
    out = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    start = 0
    for g, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = F.linear(x[start:end], w[g])
        start = end
    return out
