"""The MLA decode "prep" step in one launch: from the fused q/kv_a projection of each row, the
normalised latent and roped shared key written to the cache, and the absorbed query (q_nope @ W_UK,
then the roped q_pe) that the split kernel of engine/kernels/mla_decode.py reads.

The rounding is the torch path's (engine/model/attention.py): RMSNorm normalises in float32, rounds to
the model dtype, multiplies by the weight and rounds again; RoPE rotates (even, odd) pairs in
float32 by the complex table row and rounds; q_nope @ W_UK accumulates in float32 and rounds, as
torch.bmm does."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_B = 16  # rows per program: tl.dot needs M >= 16; W_UK is read once per block of rows


@triton.jit
def _rope_pairs(src, table, i, mask):
    """Rotate interleaved pairs: src -> x[2i], x[2i+1] of each row, table -> (cos, sin) of each
    row's position. [BB, HALF] loads; returns (even, odd) float32."""
    a = tl.load(src + 2 * i, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(src + 2 * i + 1, mask=mask, other=0.0).to(tl.float32)
    c = tl.load(table + 2 * i, mask=mask, other=0.0)
    s = tl.load(table + 2 * i + 1, mask=mask, other=0.0)
    return a * c - b * s, a * s + b * c


@triton.jit
def _prep_kernel(q_ptr, kv_ptr, norm_w_ptr, w_uk_ptr, table_ptr, pos_ptr, slots_ptr, cache_ptr, pages_ptr, q_out_ptr,
                 n_rows, stride_q, stride_kv, stride_cp, stride_cn, stride_pt, eps,
                 PAGE: tl.constexpr, NH: tl.constexpr, NOPE: tl.constexpr, ROPE: tl.constexpr, RANK: tl.constexpr,
                 NOPE_P: tl.constexpr, HALF_P: tl.constexpr, RANK_P: tl.constexpr,
                 BLOCK_B: tl.constexpr, BLOCK_R: tl.constexpr, N_RCHUNK: tl.constexpr,
                 INPUT_PRECISION: tl.constexpr):
    # program (row block, j): j < NH * N_RCHUNK is one head's slice of the absorbed query; the last
    # j writes the block's latent and k_pe to the cache
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)  # [BB]
    live = rows < n_rows
    j = tl.program_id(1)
    half = ROPE // 2
    i = tl.arange(0, HALF_P)  # pair index
    pair_mask = live[:, None] & (i < half)[None, :]  # [BB, HALF_P]
    pos = tl.load(pos_ptr + rows, mask=live, other=0)  # [BB]
    table = table_ptr + pos[:, None].to(tl.int64) * ROPE  # [BB, 1]: float32 (cos, sin) pairs of the row
    width = RANK + ROPE  # of a cache entry and of an absorbed query head
    dtype = kv_ptr.dtype.element_ty  # the model dtype
    if j == NH * N_RCHUNK:
        dl = tl.arange(0, RANK_P)
        lat_mask = live[:, None] & (dl < RANK)[None, :]  # [BB, RANK_P]
        kv_row = kv_ptr + rows[:, None].to(tl.int64) * stride_kv  # [BB, 1]
        h = tl.load(kv_row + dl[None, :], mask=lat_mask, other=0.0).to(tl.float32)  # [BB, RANK_P]
        var = tl.sum(h * h, axis=1) / RANK  # [BB]
        h = (h * tl.rsqrt(var + eps)[:, None]).to(dtype)
        w = tl.load(norm_w_ptr + dl, mask=dl < RANK, other=0.0)  # [RANK_P]
        latent = (w.to(tl.float32)[None, :] * h.to(tl.float32)).to(dtype)  # [BB, RANK_P]
        even, odd = _rope_pairs(kv_row + RANK, table, i[None, :], pair_mask)  # [BB, HALF_P] each
        slot = tl.load(slots_ptr + rows, mask=live, other=0)
        page = tl.load(pages_ptr + slot.to(tl.int64) * stride_pt + pos // PAGE, mask=live, other=0)  # [BB]
        dst = (cache_ptr + page[:, None].to(tl.int64) * stride_cp
               + (pos % PAGE)[:, None].to(tl.int64) * stride_cn)  # [BB, 1]
        cdt = cache_ptr.dtype.element_ty
        tl.store(dst + dl[None, :], latent.to(cdt), mask=lat_mask)
        tl.store(dst + RANK + 2 * i[None, :], even.to(dtype).to(cdt), mask=pair_mask)
        tl.store(dst + RANK + 2 * i[None, :] + 1, odd.to(dtype).to(cdt), mask=pair_mask)
    else:
        head = j // N_RCHUNK
        chunk = j % N_RCHUNK
        dn = tl.arange(0, NOPE_P)
        q_head = q_ptr + rows[:, None].to(tl.int64) * stride_q + head * (NOPE + ROPE)  # [BB, 1]
        q_nope = tl.load(q_head + dn[None, :], mask=live[:, None] & (dn < NOPE)[None, :], other=0.0)  # [BB, NOPE_P]
        dr = chunk * BLOCK_R + tl.arange(0, BLOCK_R)
        w_mask = (dn < NOPE)[:, None] & (dr < RANK)[None, :]
        w_uk = tl.load(w_uk_ptr + head * NOPE * RANK + dn[:, None] * RANK + dr[None, :], mask=w_mask,
                       other=0.0)  # [NOPE_P, BLOCK_R]
        q_lat = tl.dot(q_nope, w_uk, input_precision=INPUT_PRECISION)  # [BB, BLOCK_R] fp32
        out = q_out_ptr + (rows[:, None].to(tl.int64) * NH + head) * width  # [BB, 1]
        tl.store(out + dr[None, :], q_lat.to(q_out_ptr.dtype.element_ty), mask=live[:, None] & (dr < RANK)[None, :])
        if chunk == 0:
            even, odd = _rope_pairs(q_head + NOPE, table, i[None, :], pair_mask)  # [BB, HALF_P] each
            tl.store(out + RANK + 2 * i[None, :], even.to(q_out_ptr.dtype.element_ty), mask=pair_mask)
            tl.store(out + RANK + 2 * i[None, :] + 1, odd.to(q_out_ptr.dtype.element_ty), mask=pair_mask)


def mla_prep(q: torch.Tensor, kv: torch.Tensor, kv_norm: torch.Tensor, w_uk: torch.Tensor, rope_table: torch.Tensor,
             positions: torch.Tensor, slots: torch.Tensor, cache_layer: torch.Tensor, *, pages: torch.Tensor,
             eps: float = 1e-6) -> torch.Tensor:
    """q: [B, nh*(nope+rope)] (rows may be strided); kv: [B, rank+rope] latent then k_pe (rows may be
    strided); kv_norm: [rank]; w_uk: [nh, nope, rank]; rope_table: complex64 [max_len, rope/2];
    positions, slots: [B]; cache_layer: the layer's pages [pages, P, rank+rope], written at each row's
    position through its slot's row of the page table `pages` [S, max pages] (engine/kv_cache.py).
    Returns the absorbed query [B, nh, rank+rope] in q's dtype. One launch, graph-safe."""
    b = q.shape[0]
    nh, nope, rank = w_uk.shape
    rope = kv.shape[1] - rank
    assert q.stride(1) == 1 and kv.stride(1) == 1 and cache_layer.stride(2) == 1 and w_uk.is_contiguous()
    table = torch.view_as_real(rope_table)  # [max_len, rope/2, 2] float32 (a view)
    assert table.is_contiguous()
    q_out = torch.empty(b, nh, rank + rope, dtype=q.dtype, device=q.device)  # [B, nh, rank+rope]
    block_r = min(128, max(16, triton.next_power_of_2(rank)))
    n_rchunk = triton.cdiv(rank, block_r)
    grid = (triton.cdiv(b, BLOCK_B), nh * n_rchunk + 1)
    _prep_kernel[grid](q, kv, kv_norm, w_uk, table, positions, slots, cache_layer, pages, q_out,
                       b, q.stride(0), kv.stride(0), cache_layer.stride(0), cache_layer.stride(1), pages.stride(0), eps,
                       PAGE=cache_layer.shape[1], NH=nh, NOPE=nope, ROPE=rope, RANK=rank,
                       NOPE_P=max(16, triton.next_power_of_2(nope)), HALF_P=triton.next_power_of_2(rope // 2),
                       RANK_P=triton.next_power_of_2(rank), BLOCK_B=BLOCK_B, BLOCK_R=block_r, N_RCHUNK=n_rchunk,
                       INPUT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
    return q_out
