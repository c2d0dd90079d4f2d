"""The start of a decode layer at one row, in one launch: the previous layer's output added to the
residual stream (a MoE layer's routes in order plus its shared experts, or a dense delta), the
input RMSNorm, and the fused q/kv_a projection of MLA (MLAttention.q_kv_a). At one row the norm
kernel and cuBLAS's GEMV cost a few µs each above their bytes; here every program recomputes the
row's norm from the inputs (L2-resident, ~57 KB at lite's shapes) and multiplies it into its block
of the projection's rows, so the norm has no launch of its own.

Rounding is engine/kernels/rmsnorm.py's: the routes summed in route order in float32 and rounded,
plus the shared experts, rounded; plus the residual, rounded; normalised in float32, rounded, times
the weight, rounded; then the projection accumulated in float32 (cuBLAS's order differs) and
rounded. Every program sums the squares in the same order, so all use the same normalised row."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.mla_prep import Prep, prep_head_tail, prep_kv_tail
from engine.kernels.rmsnorm import residual_sum
from engine.kernels.ticket import last_to_finish

MAX_ROWS = 1  # the decode step uses it at one row (0: the norm kernel and cuBLAS's GEMV)
BLOCK_J = 16  # projection rows per program: 228 programs for lite's 3,648
# input columns per step; K or more: the block's rows in one tile, loaded before the norm (measured
# on the H200, docs/perf-notes.md row 36: 8.3 -> 7.0 µs a layer at lite's K = 2048)
BLOCK_K = 2048
NUM_WARPS = 4
# MLA's prep step (engine/kernels/mla_prep.py) in this launch's tails, where the decode step passes
# a Prep (MLAttention.prep_args); then no prep launch
FUSED_PREP = True


@triton.jit
def _norm_proj_kernel(routed_ptr, delta_ptr, res_ptr, norm_w_ptr, w_ptr, out_ptr, x_out_ptr, N, eps,
                      ticket_ptr, w_uk_ptr, kv_norm_ptr, table_ptr, pos_ptr, slots_ptr, cache_ptr, q_out_ptr,
                      stride_cs, stride_cn, kv_eps,
                      K: tl.constexpr, TOP_K: tl.constexpr, MODE: tl.constexpr, BLOCK_J: tl.constexpr,
                      BLOCK_K: tl.constexpr, PREP: tl.constexpr = False, NH: tl.constexpr = 1,
                      NOPE: tl.constexpr = 1, ROPE: tl.constexpr = 2, RANK: tl.constexpr = 1,
                      RANK_P: tl.constexpr = 1, HALF_P: tl.constexpr = 1, BLOCK_D: tl.constexpr = 1):
    j = tl.program_id(0)
    dtype = x_out_ptr.dtype.element_ty
    r = j * BLOCK_J + tl.arange(0, BLOCK_J)
    r_ok = r < N
    if BLOCK_K >= K:
        # the block's whole rows of the projection in one tile, asked for before the norm so that
        # their latency overlaps it (a store comes first otherwise, and loads are not moved above it)
        ks = tl.arange(0, BLOCK_K)
        k_ok = ks < K
        w = tl.load(w_ptr + r[:, None] * K + ks[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        x = residual_sum(routed_ptr, delta_ptr, res_ptr, ks, k_ok, K, TOP_K, MODE, dtype)
        if MODE != 0 and j == 0:
            tl.store(x_out_ptr + ks, x, mask=k_ok)
        xf = x.to(tl.float32)
        h = (xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / K + eps)).to(dtype)
        nw = tl.load(norm_w_ptr + ks, mask=k_ok, other=0.0)
        h = (nw.to(tl.float32) * h.to(tl.float32)).to(dtype)
        out = tl.sum(w.to(tl.float32) * h.to(tl.float32)[None, :], axis=1)
        tl.store(out_ptr + r, out.to(out_ptr.dtype.element_ty), mask=r_ok)
    else:
        # pass 1: the new residual row (program 0 stores it) and its sum of squares
        sq = tl.zeros([BLOCK_K], tl.float32)
        for k0 in tl.static_range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            x = residual_sum(routed_ptr, delta_ptr, res_ptr, ks, k_ok, K, TOP_K, MODE, dtype)
            if MODE != 0 and j == 0:
                tl.store(x_out_ptr + ks, x, mask=k_ok)
            xf = x.to(tl.float32)
            sq += xf * xf
        scale = tl.rsqrt(tl.sum(sq, axis=0) / K + eps)
        # pass 2: the normalised row (inputs again, from L1/L2) into this block of the projection
        acc = tl.zeros([BLOCK_J, BLOCK_K], tl.float32)
        for k0 in tl.static_range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            w = tl.load(w_ptr + r[:, None] * K + ks[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)
            x = residual_sum(routed_ptr, delta_ptr, res_ptr, ks, k_ok, K, TOP_K, MODE, dtype)
            h = (x.to(tl.float32) * scale).to(dtype)
            nw = tl.load(norm_w_ptr + ks, mask=k_ok, other=0.0)
            h = (nw.to(tl.float32) * h.to(tl.float32)).to(dtype)
            acc += w.to(tl.float32) * h.to(tl.float32)[None, :]
        tl.store(out_ptr + r, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=r_ok)
    if PREP:
        # group g < NH: head g's NOPE+ROPE rows of q (a whole number of blocks); g == NH: the kv rows
        per_head = (NOPE + ROPE) // BLOCK_J
        g = tl.minimum(j // per_head, NH)
        members = tl.where(g < NH, per_head, tl.num_programs(0) - NH * per_head)
        if last_to_finish(ticket_ptr + g, members):
            pos = tl.load(pos_ptr)
            table = table_ptr + pos.to(tl.int64) * ROPE  # float32 (cos, sin) pairs of the row's position
            if g < NH:
                prep_head_tail(out_ptr, w_uk_ptr, table, q_out_ptr, g, NOPE, ROPE, RANK, RANK_P, HALF_P, BLOCK_D)
            else:
                slot = tl.load(slots_ptr)
                dst = cache_ptr + slot.to(tl.int64) * stride_cs + pos.to(tl.int64) * stride_cn
                prep_kv_tail(out_ptr + NH * (NOPE + ROPE), kv_norm_ptr, table, dst, kv_eps, ROPE, RANK, RANK_P,
                             HALF_P)
            tl.store(ticket_ptr + g, 0)  # every member has taken its ticket: ready for the next launch


def norm_proj(delta, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
              block_j: int | None = None, block_k: int | None = None, num_warps: int | None = None,
              prep: Prep | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """delta: None, a [1, K] tensor, or a MoE layer's (routed [1, k, K] float32, shared [1, K]);
    residual [1, K]; norm_weight [K]; weight [N, K]. With x = residual + delta, returns
    (F.linear(norm(x) * norm_weight, weight) [1, N], x [1, K]). One launch, graph-safe. The tiling
    defaults to the module's BLOCK_J, BLOCK_K (K or more: the one-tile form) and NUM_WARPS.
    prep: the projection is MLA's q (nh heads of nope + rope rows) then kv_a (rank + rope rows); the
    launch's tails also do mla_prep's work (the latent and roped key into the cache) and it returns
    (the absorbed query [1, nh, rank + rope], x) instead; blocks shrink to fit a head's rows."""
    block_j, block_k, num_warps = block_j or BLOCK_J, block_k or BLOCK_K, num_warps or NUM_WARPS
    t, k = residual.shape
    n = weight.shape[0]
    assert t == 1 and weight.is_contiguous() and weight.shape[1] == k
    residual = residual.contiguous()
    if delta is None:
        mode, routed, d, top_k = 0, residual, residual, 1
    elif isinstance(delta, tuple):
        routed, d = delta[0].contiguous(), delta[1].contiguous()
        mode, top_k = 2, routed.shape[1]
    else:
        mode, routed, d, top_k = 1, residual, delta.contiguous(), 1
    out = torch.empty(t, n, dtype=weight.dtype, device=weight.device)  # [1, N]
    x_out = torch.empty_like(residual) if mode else residual
    args, extra, q_out = (out,) * 8 + (0, 0, 0.0), {}, None  # the prep arguments, unused without prep
    if prep is not None:
        nh, nope, rank = prep.w_uk.shape
        rope = 2 * prep.rope_table.shape[1]
        head = (n - rank - rope) // nh  # nope + rope
        assert head == nope + rope and nh * head + rank + rope == n and prep.tickets.numel() > nh
        assert prep.w_uk.is_contiguous() and prep.cache_layer.stride(2) == 1
        block_j = min(block_j, head & -head)  # the largest power of two dividing a head's rows
        table = torch.view_as_real(prep.rope_table)  # [max_len, rope/2, 2] float32
        q_out = torch.empty(t, nh, rank + rope, dtype=weight.dtype, device=weight.device)  # [1, nh, rank+rope]
        c = prep.cache_layer
        args = (prep.tickets, prep.w_uk, prep.kv_norm, table, prep.positions, prep.slots, c, q_out, c.stride(0),
                c.stride(1), prep.eps)
        extra = dict(PREP=True, NH=nh, NOPE=nope, ROPE=rope, RANK=rank, RANK_P=triton.next_power_of_2(rank),
                     HALF_P=triton.next_power_of_2(rope // 2), BLOCK_D=min(16, triton.next_power_of_2(nope)))
    _norm_proj_kernel[(triton.cdiv(n, block_j),)](
        routed, d, residual, norm_weight, weight, out, x_out, n, eps, *args, K=k, TOP_K=top_k, MODE=mode,
        BLOCK_J=block_j, BLOCK_K=min(block_k, triton.next_power_of_2(k)), num_warps=num_warps, **extra)
    return (out if q_out is None else q_out), x_out
