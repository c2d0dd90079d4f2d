"""Rotary position embedding for the 64-wide shared RoPE key: plain RoPE or YaRN, computed with the
same float32 operations as the reference so that fp32 runs agree with it bit for bit."""
from __future__ import annotations

import math

import torch

from pegainfer.engine.config import ModelConfig, yarn_mscale


def inv_freq_and_scale(cfg: ModelConfig) -> tuple[torch.Tensor, float]:
    """([rope_dim/2] float32 inverse frequencies, cos/sin scale)."""
    dim, base = cfg.qk_rope_head_dim, cfg.rope_theta
    rs = cfg.rope_scaling
    if not rs:
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    factor = float(rs["factor"])
    mscale, mscale_all = rs.get("mscale"), rs.get("mscale_all_dim")
    if rs.get("attention_factor") is not None:
        attn = float(rs["attention_factor"])
    elif mscale and mscale_all:
        attn = float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all))
    else:
        attn = yarn_mscale(factor, 1.0)
    beta_fast = rs.get("beta_fast") or 32
    beta_slow = rs.get("beta_slow") or 1
    orig = rs["original_max_position_embeddings"]

    def corr_dim(rot: float) -> float:
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolated = 1.0 / pos_freqs
    interpolated = 1.0 / (factor * pos_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # weight of the unscaled frequency
    return interpolated * (1 - keep) + extrapolated * keep, attn


class Rope:
    """Precomputed complex rotations for every position up to max_len, on one device."""

    def __init__(self, cfg: ModelConfig, max_len: int, device: torch.device | str = "cpu"):
        inv_freq, scale = inv_freq_and_scale(cfg)
        pos = torch.arange(max_len, dtype=torch.float32)
        freqs = pos[:, None] * inv_freq[None, :]  # [max_len, rope/2]
        self.table = (torch.polar(torch.ones_like(freqs), freqs) * scale).to(device)  # complex64

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [T, ..., rope] with interleaved (even, odd) pairs; positions: [T]."""
        rot = self.table[positions]  # [T, rope/2]
        rot = rot.view(rot.shape[0], *([1] * (x.dim() - 2)), rot.shape[-1])
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * rot).flatten(-2).type_as(x)
