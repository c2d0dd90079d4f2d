"""MLA decode attention over the latent cache, flash-decoding style: each program takes one row and
one split of its context, scores all heads against the cached 512-wide latent plus the 64-wide RoPE
key, keeps an online softmax, and accumulates the latent-space output; a second kernel merges the
splits. Rows attend only to their own length, so one launch serves rows at any positions."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _split_kernel(q_ptr, cache_ptr, slots_ptr, lens_ptr, part_o_ptr, part_ml_ptr, scale,
                  stride_cs, stride_cn,
                  H: tl.constexpr, RANK: tl.constexpr, ROPE: tl.constexpr, BLOCK_N: tl.constexpr,
                  SPLIT: tl.constexpr):
    b = tl.program_id(0)
    split = tl.program_id(1)
    n_splits = tl.num_programs(1)
    slot = tl.load(slots_ptr + b)
    length = tl.load(lens_ptr + b)
    heads = tl.arange(0, H)
    dl = tl.arange(0, RANK)
    dr = tl.arange(0, ROPE)
    width = RANK + ROPE
    q_lat = tl.load(q_ptr + b * H * width + heads[:, None] * width + dl[None, :])  # [H, RANK]
    q_pe = tl.load(q_ptr + b * H * width + heads[:, None] * width + RANK + dr[None, :])  # [H, ROPE]
    m = tl.full([H], float("-inf"), tl.float32)
    lsum = tl.zeros([H], tl.float32)
    acc = tl.zeros([H, RANK], tl.float32)
    start = split * SPLIT
    end = tl.minimum(start + SPLIT, length)
    base = cache_ptr + slot.to(tl.int64) * stride_cs
    for n0 in range(0, SPLIT, BLOCK_N):  # fixed trip count; blocks past `end` load nothing
        offs = start + n0 + tl.arange(0, BLOCK_N)
        valid = offs < end
        kv_lat = tl.load(base + offs[:, None] * stride_cn + dl[None, :], mask=valid[:, None], other=0.0)  # [N, RANK]
        k_pe = tl.load(base + offs[:, None] * stride_cn + RANK + dr[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q_lat, tl.trans(kv_lat)) + tl.dot(q_pe, tl.trans(k_pe))  # [H, N] fp32
        s = tl.where(valid[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        empty = m_new == float("-inf")  # nothing valid yet in this split: keep the state at zero
        alpha = tl.where(empty, 1.0, tl.exp(m - m_new))
        p = tl.where(empty[:, None], 0.0, tl.exp(s - m_new[:, None]))
        lsum = lsum * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kv_lat.dtype), kv_lat)
        m = m_new
    part = (b * n_splits + split) * H
    tl.store(part_o_ptr + (part + heads[:, None]) * RANK + dl[None, :], acc)
    tl.store(part_ml_ptr + (part + heads) * 2, m)
    tl.store(part_ml_ptr + (part + heads) * 2 + 1, lsum)


@triton.jit
def _merge_kernel(part_o_ptr, part_ml_ptr, out_ptr, H: tl.constexpr, RANK: tl.constexpr, NSPLIT: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    dl = tl.arange(0, RANK)
    m = float("-inf")
    for s in range(0, NSPLIT):
        m = tl.maximum(m, tl.load(part_ml_ptr + ((b * NSPLIT + s) * H + h) * 2))
    total = 0.0
    acc = tl.zeros([RANK], tl.float32)
    for s in range(0, NSPLIT):
        idx = (b * NSPLIT + s) * H + h
        ms = tl.load(part_ml_ptr + idx * 2)
        w = tl.where(ms == float("-inf"), 0.0, tl.exp(ms - m))
        total += tl.load(part_ml_ptr + idx * 2 + 1) * w
        acc += tl.where(w > 0, tl.load(part_o_ptr + idx * RANK + dl) * w, 0.0)
    tl.store(out_ptr + (b * H + h) * RANK + dl, (acc / total).to(out_ptr.dtype.element_ty))


def mla_decode(q: torch.Tensor, cache_layer: torch.Tensor, slots: torch.Tensor, lens: torch.Tensor,
               length: int, scale: float, rank: int, split_len: int = 256) -> torch.Tensor:
    """q: [B, H, rank+rope] (absorbed query: latent part then RoPE part); cache_layer: [S, N, rank+rope];
    slots, lens: [B]; length: static bound >= every len. Returns o_lat [B, H, rank]."""
    b, h, width = q.shape
    n_splits = triton.cdiv(length, split_len)
    part_o = torch.empty(b, n_splits, h, rank, dtype=torch.float32, device=q.device)
    part_ml = torch.empty(b, n_splits, h, 2, dtype=torch.float32, device=q.device)
    out = torch.empty(b, h, rank, dtype=q.dtype, device=q.device)
    _split_kernel[(b, n_splits)](q.contiguous(), cache_layer, slots, lens, part_o, part_ml, scale,
                                 cache_layer.stride(0), cache_layer.stride(1),
                                 H=h, RANK=rank, ROPE=width - rank, BLOCK_N=32, SPLIT=split_len, num_warps=8)
    _merge_kernel[(b, h)](part_o, part_ml, out, H=h, RANK=rank, NSPLIT=n_splits)
    return out
