"""The start of a decode layer at one row, in one launch: the previous layer's output added to the
residual stream (a MoE layer's routes in order plus its shared experts, or a dense delta), the
input RMSNorm, and the fused q/kv_a projection of MLA (MLAttention.q_kv_a). At one row the norm
kernel and cuBLAS's GEMV cost a few µs each above their bytes; here every program recomputes the
row's norm from the inputs (L2-resident, ~57 KB at lite's shapes) and multiplies it into its block
of the projection's rows, so the norm has no launch of its own.

Rounding is engine/kernels/rmsnorm.py's: the routes summed in route order in float32 and rounded,
plus the shared experts, rounded; plus the residual, rounded; normalised in float32, rounded, times
the weight, rounded; then the projection accumulated in float32 (cuBLAS's order differs) and
rounded. Every program sums the squares in the same order, so all use the same normalised row.
The rows it takes in the decode step, whether the first layer's launch reads the embedding row
itself, and its tiling: KernelConfig.norm_proj_rows, embed_in_norm and norm_proj."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pegainfer.engine.kernels.config import RowTiling
from pegainfer.engine.kernels.rmsnorm import residual_sum


@triton.jit
def normed(x, scale, norm_w_ptr, ks, k_ok, dtype: tl.constexpr):
    """Columns ks of the normalised row: x times the row's scale, rounded, times the norm weight,
    rounded (rmsnorm.py's order)."""
    h = (x.to(tl.float32) * scale).to(dtype)
    nw = tl.load(norm_w_ptr + ks, mask=k_ok, other=0.0)
    return (nw.to(tl.float32) * h.to(tl.float32)).to(dtype)


@triton.jit
def _norm_proj_kernel(routed_ptr, delta_ptr, res_ptr, norm_w_ptr, w_ptr, out_ptr, x_out_ptr, ids_ptr, N, eps,
                      K: tl.constexpr, TOP_K: tl.constexpr, MODE: tl.constexpr, BLOCK_J: tl.constexpr,
                      BLOCK_K: tl.constexpr, EMBED: tl.constexpr):
    # EMBED (MODE 0): res_ptr is the embedding table and the row is the token's, ids_ptr[0]
    j = tl.program_id(0)
    dtype = x_out_ptr.dtype.element_ty
    if EMBED:
        res_ptr += tl.load(ids_ptr).to(tl.int64) * K
    r = j * BLOCK_J + tl.arange(0, BLOCK_J)
    r_ok = r < N
    if BLOCK_K >= K:
        # the block's whole rows of the projection in one tile, asked for before the norm so that
        # their latency overlaps it (a store comes first otherwise, and loads are not moved above it)
        ks = tl.arange(0, BLOCK_K)
        k_ok = ks < K
        w = tl.load(w_ptr + r[:, None] * K + ks[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        x = residual_sum(routed_ptr, delta_ptr, res_ptr, ks, k_ok, K, TOP_K, MODE, dtype)
        if (MODE != 0 or EMBED) and j == 0:
            tl.store(x_out_ptr + ks, x, mask=k_ok)
        xf = x.to(tl.float32)
        h = normed(x, tl.rsqrt(tl.sum(xf * xf, axis=0) / K + eps), norm_w_ptr, ks, k_ok, dtype)
        out = tl.sum(w.to(tl.float32) * h.to(tl.float32)[None, :], axis=1)
        tl.store(out_ptr + r, out.to(out_ptr.dtype.element_ty), mask=r_ok)
    else:
        # pass 1: the new residual row (program 0 stores it) and its sum of squares
        sq = tl.zeros([BLOCK_K], tl.float32)
        for k0 in tl.static_range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            x = residual_sum(routed_ptr, delta_ptr, res_ptr, ks, k_ok, K, TOP_K, MODE, dtype)
            if (MODE != 0 or EMBED) and j == 0:
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
            h = normed(x, scale, norm_w_ptr, ks, k_ok, dtype)
            acc += w.to(tl.float32) * h.to(tl.float32)[None, :]
        tl.store(out_ptr + r, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=r_ok)


def norm_proj(delta, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
              tiling: RowTiling, token: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """delta: None, a [1, K] tensor, or a MoE layer's (routed [1, k, K] float32, shared [1, K]);
    residual [1, K]; norm_weight [K]; weight [N, K]. With x = residual + delta, returns
    (F.linear(norm(x) * norm_weight, weight) [1, N], x [1, K]). token ([1] int64, delta None): the
    first layer's form, residual is then the embedding table [V, K] and x its row token[0] (as
    F.embedding, no launch of its own). One launch, graph-safe. tiling: rows per program, the K block
    (K or more: the one-tile form) and the warps."""
    block_j, block_k, num_warps = tiling.block_j, tiling.block_k, tiling.num_warps
    t, k = (1, residual.shape[1]) if token is not None else residual.shape
    n = weight.shape[0]
    assert t == 1 and weight.is_contiguous() and weight.shape[1] == k
    if token is not None and (delta is not None or token.shape != (1,)):
        raise ValueError("norm_proj reads an embedding row for one token and no delta")
    residual = residual.contiguous()
    if delta is None:
        mode, routed, d, top_k = 0, residual, residual, 1
    elif isinstance(delta, tuple):
        routed, d = delta[0].contiguous(), delta[1].contiguous()
        mode, top_k = 2, routed.shape[1]
    else:
        mode, routed, d, top_k = 1, residual, delta.contiguous(), 1
    out = torch.empty(t, n, dtype=weight.dtype, device=weight.device)  # [1, N]
    x_out = torch.empty(t, k, dtype=residual.dtype, device=residual.device) if mode or token is not None else residual
    _norm_proj_kernel[(triton.cdiv(n, block_j),)](
        routed, d, residual, norm_weight, weight, out, x_out, residual if token is None else token, n, eps, K=k,
        TOP_K=top_k, MODE=mode, BLOCK_J=block_j, BLOCK_K=min(block_k, triton.next_power_of_2(k)),
        EMBED=token is not None, num_warps=num_warps)
    return out, x_out
