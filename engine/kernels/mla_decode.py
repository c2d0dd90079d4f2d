"""MLA decode attention over the latent cache, flash-decoding style: each program takes one row and
one split of its context, scores all heads against the cached 512-wide latent plus the 64-wide RoPE
key, keeps an online softmax, and accumulates the latent-space output; a second kernel merges the
splits and, in the decode step, applies W_UV so that its output goes straight to o_proj. Rows attend
only to their own length, so one launch serves rows at any positions.

This module is the auto plan (KernelConfig.batch_invariant off): the splits sized from the batch
and the graph bucket's bound (auto_split) and the merge kernel picked by batch size (merge_form):
fastest, but a row's sums then depend on its neighbours. The batch-invariant plan, whose splits follow
each row's own length, is engine/kernels/mla_fixed.py; both walk a split's keys with `attend` and
store its partial with `store_partial`."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 32  # keys per step of the split kernel


@triton.jit
def attend(q_ptr, cache_ptr, row_pages, b, start, end, stop, scale, stride_cp, stride_cn,
           H: tl.constexpr, RANK: tl.constexpr, ROPE: tl.constexpr, BLOCK_N: tl.constexpr, H_P: tl.constexpr,
           RANK_P: tl.constexpr, ROPE_P: tl.constexpr, PAGE: tl.constexpr):
    # row b's query against its keys start..end-1 (row_pages: its page table row), BLOCK_N keys a
    # step for `stop` keys (blocks past `end` load nothing): the split's (max, sum, unnormalised
    # latent output) [H_P], [H_P], [H_P, RANK_P] in float32, an online softmax in key order. H_P,
    # RANK_P, ROPE_P: the dims padded to powers of two (heads to >= 16 for tl.dot); the padding loads
    # zeros and is never stored
    heads = tl.arange(0, H_P)
    dl = tl.arange(0, RANK_P)
    dr = tl.arange(0, ROPE_P)
    hm, lm, rm = heads < H, dl < RANK, dr < ROPE
    width = RANK + ROPE
    q_row = q_ptr + b * H * width + heads[:, None] * width
    q_lat = tl.load(q_row + dl[None, :], mask=hm[:, None] & lm[None, :], other=0.0)  # [H_P, RANK_P]
    q_pe = tl.load(q_row + RANK + dr[None, :], mask=hm[:, None] & rm[None, :], other=0.0)  # [H_P, ROPE_P]
    m = tl.full([H_P], float("-inf"), tl.float32)
    lsum = tl.zeros([H_P], tl.float32)
    acc = tl.zeros([H_P, RANK_P], tl.float32)
    for n0 in range(0, stop, BLOCK_N):
        first = start + n0  # the block's first key: a block never straddles two pages
        page = tl.load(row_pages + first // PAGE, mask=first < end, other=0).to(tl.int64)
        offs = first + tl.arange(0, BLOCK_N)
        valid = offs < end
        base = cache_ptr + page * stride_cp + (offs % PAGE)[:, None] * stride_cn  # [N, 1]
        kv_lat = tl.load(base + dl[None, :], mask=valid[:, None] & lm[None, :], other=0.0)  # [N, RANK_P]
        k_pe = tl.load(base + RANK + dr[None, :], mask=valid[:, None] & rm[None, :], other=0.0)  # [N, ROPE_P]
        s = tl.dot(q_lat, tl.trans(kv_lat)) + tl.dot(q_pe, tl.trans(k_pe))  # [H_P, N] fp32
        s = tl.where(valid[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        empty = m_new == float("-inf")  # nothing valid yet in this split: keep the state at zero
        alpha = tl.where(empty, 1.0, tl.exp(m - m_new))
        p = tl.where(empty[:, None], 0.0, tl.exp(s - m_new[:, None]))
        lsum = lsum * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kv_lat.dtype), kv_lat)
        m = m_new
    return m, lsum, acc


@triton.jit
def store_partial(o_ptr, ml_ptr, w, acc, m, lsum, H: tl.constexpr, RANK: tl.constexpr, H_P: tl.constexpr,
                  RANK_P: tl.constexpr):
    # partial w (a split's or a group's): its heads' unnormalised output [H_P, RANK_P] and (max, sum)
    heads = tl.arange(0, H_P)
    dl = tl.arange(0, RANK_P)
    hm = heads < H
    rows = (w * H + heads).to(tl.int64)  # int64 offsets: past 2**31 / RANK partial rows at large H
    tl.store(o_ptr + rows[:, None] * RANK + dl[None, :], acc, mask=hm[:, None] & (dl < RANK)[None, :])
    tl.store(ml_ptr + rows * 2, m, mask=hm)
    tl.store(ml_ptr + rows * 2 + 1, lsum, mask=hm)


@triton.jit
def _split_kernel(q_ptr, cache_ptr, table_ptr, slots_ptr, lens_ptr, part_o_ptr, part_ml_ptr, scale,
                  stride_cp, stride_cn, stride_t,
                  H: tl.constexpr, RANK: tl.constexpr, ROPE: tl.constexpr, BLOCK_N: tl.constexpr,
                  SPLIT: tl.constexpr, H_P: tl.constexpr, RANK_P: tl.constexpr, ROPE_P: tl.constexpr,
                  PAGE: tl.constexpr):
    # program (row, split): SPLIT keys, a fixed trip count
    b = tl.program_id(0)
    split = tl.program_id(1)
    n_splits = tl.num_programs(1)
    slot = tl.load(slots_ptr + b)
    length = tl.load(lens_ptr + b)
    start = split * SPLIT
    end = tl.minimum(start + SPLIT, length)
    m, lsum, acc = attend(q_ptr, cache_ptr, table_ptr + slot.to(tl.int64) * stride_t, b, start, end, SPLIT, scale,
                          stride_cp, stride_cn, H, RANK, ROPE, BLOCK_N, H_P, RANK_P, ROPE_P, PAGE)
    store_partial(part_o_ptr, part_ml_ptr, b * n_splits + split, acc, m, lsum, H, RANK, H_P, RANK_P)


@triton.jit
def _merge_kernel(part_o_ptr, part_ml_ptr, w_uv_ptr, out_ptr, n_rows,
                  H: tl.constexpr, RANK: tl.constexpr, NSPLIT: tl.constexpr, V: tl.constexpr, BLOCK_V: tl.constexpr,
                  BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, APPLY_WUV: tl.constexpr,
                  INPUT_PRECISION: tl.constexpr):
    # one head over a block of rows, the latent in BLOCK_K chunks: each chunk is merged over the
    # splits and rounded to the output dtype, then either stored (o_lat) or multiplied into the
    # value head by its rows of W_UV (which each program then reads once for BLOCK_B rows); a third
    # grid axis splits the value head into BLOCK_V columns, so that W_UV streams through many SMs
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)  # [BB]
    live = rows < n_rows
    h = tl.program_id(1)
    m = tl.full([BLOCK_B], float("-inf"), tl.float32)
    for s in range(0, NSPLIT):
        m = tl.maximum(m, tl.load(part_ml_ptr + ((rows * NSPLIT + s) * H + h) * 2, mask=live, other=float("-inf")))
    total = tl.zeros([BLOCK_B], tl.float32)
    for s in range(0, NSPLIT):
        idx = (rows * NSPLIT + s) * H + h
        ms = tl.load(part_ml_ptr + idx * 2, mask=live, other=float("-inf"))
        w = tl.where(ms == float("-inf"), 0.0, tl.exp(ms - m))
        total += tl.load(part_ml_ptr + idx * 2 + 1, mask=live, other=0.0) * w
    total = tl.where(live, total, 1.0)  # rows past the batch: finite garbage, never stored
    dv = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    o = tl.zeros([BLOCK_B, BLOCK_V], tl.float32)
    for k0 in range(0, RANK, BLOCK_K):
        dk = k0 + tl.arange(0, BLOCK_K)
        kmask = live[:, None] & (dk < RANK)[None, :]  # [BB, BK]
        acc = tl.zeros([BLOCK_B, BLOCK_K], tl.float32)
        for s in range(0, NSPLIT):
            idx = (rows * NSPLIT + s) * H + h  # [BB]
            ms = tl.load(part_ml_ptr + idx * 2, mask=live, other=float("-inf"))
            w = tl.where(ms == float("-inf"), 0.0, tl.exp(ms - m))[:, None]  # [BB, 1]
            part = tl.load(part_o_ptr + idx[:, None] * RANK + dk[None, :], mask=kmask, other=0.0)  # [BB, BK]
            acc += tl.where(w > 0, part * w, 0.0)
        o_lat = (acc / total[:, None]).to(out_ptr.dtype.element_ty)  # [BB, BK]
        if APPLY_WUV:
            w_uv = tl.load(w_uv_ptr + h * RANK * V + dk[:, None] * V + dv[None, :],
                           mask=(dk < RANK)[:, None] & (dv < V)[None, :], other=0.0)  # [BK, BV]
            o = tl.dot(o_lat, w_uv, acc=o, input_precision=INPUT_PRECISION)  # [BB, BV] fp32
        else:
            tl.store(out_ptr + (rows[:, None] * H + h) * RANK + dk[None, :], o_lat, mask=kmask)
    if APPLY_WUV:
        tl.store(out_ptr + rows[:, None] * (H * V) + h * V + dv[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=live[:, None] & (dv < V)[None, :])


@triton.jit
def _merge_row_kernel(part_o_ptr, part_ml_ptr, w_uv_ptr, out_ptr,
                      H: tl.constexpr, RANK: tl.constexpr, RANK_P: tl.constexpr, NSPLIT: tl.constexpr,
                      V: tl.constexpr, BLOCK_V: tl.constexpr, APPLY_WUV: tl.constexpr):
    # program (row, head, value block): merge the row's latent over the splits (one vector, no
    # matrix unit), round it, then either store it or multiply it into BLOCK_V value columns
    b = tl.program_id(0)
    h = tl.program_id(1)
    dk = tl.arange(0, RANK_P)
    k_ok = dk < RANK
    m = float("-inf")
    for s in range(0, NSPLIT):
        m = tl.maximum(m, tl.load(part_ml_ptr + ((b * NSPLIT + s) * H + h) * 2))
    total = 0.0
    acc = tl.zeros([RANK_P], tl.float32)
    for s in range(0, NSPLIT):
        idx = (b * NSPLIT + s) * H + h
        ms = tl.load(part_ml_ptr + idx * 2)
        w = tl.where(ms == float("-inf"), 0.0, tl.exp(ms - m))
        total += tl.load(part_ml_ptr + idx * 2 + 1) * w
        acc += tl.where(w > 0, tl.load(part_o_ptr + idx * RANK + dk, mask=k_ok, other=0.0) * w, 0.0)
    o_lat = (acc / total).to(out_ptr.dtype.element_ty)  # [RANK_P]
    if APPLY_WUV:
        dv = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
        v_ok = dv < V
        w_uv = tl.load(w_uv_ptr + h * RANK * V + dk[:, None] * V + dv[None, :], mask=k_ok[:, None] & v_ok[None, :],
                       other=0.0)  # [RANK_P, BLOCK_V]
        o = tl.sum(o_lat.to(tl.float32)[:, None] * w_uv.to(tl.float32), axis=0)  # [BLOCK_V]
        tl.store(out_ptr + b * (H * V) + h * V + dv, o.to(out_ptr.dtype.element_ty), mask=v_ok)
    else:
        tl.store(out_ptr + (b * H + h) * RANK + dk, o_lat, mask=k_ok)


def auto_split(batch: int, length: int, programs: int, block: int = 32) -> int:
    """Context per split program: enough splits that batch x splits fills the GPU (`programs`,
    KernelConfig.split_programs) without going below one block of keys per split. Static per graph
    bucket."""
    n = max(1, min(triton.cdiv(programs, batch), triton.cdiv(length, block)))
    return triton.cdiv(triton.cdiv(length, n), block) * block


def attention_out(q: torch.Tensor, rank: int, w_uv_t: torch.Tensor | None) -> tuple[int, torch.Tensor]:
    """(value width, the merge's output): o_lat [B, H, rank] without W_UV (width 1), else the value
    heads [B, H*V] for w_uv_t [H, rank, V]; q's dtype."""
    b, h, _ = q.shape
    if w_uv_t is None:
        return 1, torch.empty(b, h, rank, dtype=q.dtype, device=q.device)
    assert w_uv_t.is_contiguous() and w_uv_t.shape[:2] == (h, rank)
    return w_uv_t.shape[2], torch.empty(b, h * w_uv_t.shape[2], dtype=q.dtype, device=q.device)


def merge_form(batch: int, row_max_batch: int) -> str:
    """"row": a program per (row, head, value block), up to row_max_batch rows
    (KernelConfig.row_merge_max_batch); "block": 16 rows per program with tl.dot."""
    return "row" if batch <= row_max_batch else "block"


def mla_decode(q: torch.Tensor, cache_layer: torch.Tensor, table: torch.Tensor, slots: torch.Tensor,
               lens: torch.Tensor, length: int, scale: float, rank: int, *, split_len: int, merge: str,
               w_uv_t: torch.Tensor | None = None) -> torch.Tensor:
    """q: [B, H, rank+rope] (absorbed query: latent part then RoPE part); cache_layer: the layer's
    pages [pages, P, rank+rope]; table: [S, max pages] int32, each slot's pages (engine/kv_cache.py);
    slots, lens: [B]; length: static bound >= every len. Each block of BLOCK_N keys reads one table
    entry: the page size and every split length are multiples of BLOCK_N, so a block lies in one page
    and its keys, their order and the sums are those of an unpaged cache whatever pages a row got.
    split_len keys per split program (auto_split), merge "row" or "block" (both compute the same;
    merge_form). Returns o_lat [B, H, rank]; or, given w_uv_t [H, rank, V], the value heads o_lat
    (rounded to q's dtype) @ w_uv_t[h] with float32 accumulation, rounded: [B, H*V], ready for
    o_proj. Two launches, graph-safe."""
    b, h, width = q.shape
    page = cache_layer.shape[1]
    if page % BLOCK_N or split_len % BLOCK_N:
        raise ValueError(f"the page size ({page}) and split length ({split_len}) must be multiples of {BLOCK_N}")
    if merge not in ("row", "block"):
        raise ValueError(f"merge {merge!r}: the auto plan merges by 'row' or 'block' (the fixed plan: mla_fixed)")
    n_splits = triton.cdiv(length, split_len)
    part_o = torch.empty(b, n_splits, h, rank, dtype=torch.float32, device=q.device)  # [B, S, H, rank] per split
    part_ml = torch.empty(b, n_splits, h, 2, dtype=torch.float32, device=q.device)  # [B, S, H, (max, sum)]
    _split_kernel[(b, n_splits)](q.contiguous(), cache_layer, table, slots, lens, part_o, part_ml, scale,
                                 cache_layer.stride(0), cache_layer.stride(1), table.stride(0),
                                 H=h, RANK=rank, ROPE=width - rank, BLOCK_N=BLOCK_N, SPLIT=split_len,
                                 H_P=max(16, triton.next_power_of_2(h)), RANK_P=triton.next_power_of_2(rank),
                                 ROPE_P=max(16, triton.next_power_of_2(width - rank)), PAGE=page, num_warps=8)
    v, out = attention_out(q, rank, w_uv_t)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    if merge == "row":
        block_v = min(32, triton.next_power_of_2(v)) if w_uv_t is not None else 1
        _merge_row_kernel[(b, h, triton.cdiv(v, block_v) if w_uv_t is not None else 1)](
            part_o, part_ml, w_uv_t if w_uv_t is not None else part_o, out, H=h, RANK=rank,
            RANK_P=triton.next_power_of_2(rank), NSPLIT=n_splits, V=v, BLOCK_V=block_v, APPLY_WUV=w_uv_t is not None,
            num_warps=4)
        return out
    block_b = 16  # tl.dot needs M >= 16
    # value columns per program: narrow at small batches, where W_UV's bytes are the cost
    block_v = max(16, triton.next_power_of_2(v)) if w_uv_t is None or b > 16 else 16
    _merge_kernel[(triton.cdiv(b, block_b), h, triton.cdiv(v, block_v))](
        part_o, part_ml, w_uv_t if w_uv_t is not None else part_o, out, b,
        H=h, RANK=rank, NSPLIT=n_splits, V=v, BLOCK_V=block_v, BLOCK_B=block_b,
        BLOCK_K=min(64, max(16, triton.next_power_of_2(rank))), APPLY_WUV=w_uv_t is not None,
        INPUT_PRECISION=precision)
    return out
