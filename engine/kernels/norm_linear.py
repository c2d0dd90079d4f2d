"""The start of a decode layer in batch-invariant mode (KernelConfig.norm_linear_rows, opt-in): the
residual add, the input RMSNorm and the q/kv_a projection of one row in one launch, with the bits of
the multi-row path, so that a request alone in a step gets what it gets in a crowd.

Two kernels share one order of sums:
- `dot_norm` (any row count, one program a row): the residual stream's new row (rmsnorm.py's
  residual_sum: routes in order, then the shared experts, then the residual) and its RMSNorm, the
  sum of squares taken as a dot product of the row with itself, tl.dot over block_k-wide steps in
  order from zero. The row is alone in a 16-row tile (the other rows zero), and an MMA's sum for one
  output element does not depend on the other rows or columns of its tile: the property the
  invariant linear (engine/kernels/linear.py) already rests on. tl.sum's order follows the tensor's
  layout, which the compiler chooses per kernel, so a norm recomputed inside another kernel could
  not promise the norm kernel's bits; the dot can.
- `norm_linear` (one row): every program recomputes that sum of squares the same way, normalises
  the row block by block as it walks K, and feeds each block into its columns of the projection
  exactly as the invariant linear does at any row count: tl.dot on a 16-row tile (the row and zeros),
  block_k steps summed in float32 per k_chunk, the chunks' sums added in order to a total, rounded
  once (LinearTiling's block_k and k_chunk: the same tiling gives the same bits). So norm_linear's
  output is dot_norm's followed by triton_linear's, bit for bit.
- `linear_norm` (one row, the end of the MLA layer): o_proj's columns block by block in the
  invariant linear's order, then the program taking the last ticket (engine/kernels/ticket.py) adds
  the residual and normalises the row as dot_norm does: triton_linear then dot_norm, bit for bit.

Rounding as rmsnorm.py's: normalised in float32, rounded, times the weight, rounded."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pegainfer.engine.kernels.config import LinearTiling
from pegainfer.engine.kernels.norm_proj import normed
from pegainfer.engine.kernels.rmsnorm import residual_sum
from pegainfer.engine.kernels.ticket import last_to_finish


@triton.jit
def _sum_squares(routed_ptr, delta_ptr, res_ptr, K, TOP_K: tl.constexpr, MODE: tl.constexpr, dtype: tl.constexpr,
                 BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, CG: tl.constexpr = False):
    """The row's sum of squares: tl.dot of the row with itself, BLOCK_K columns a step, in order."""
    lanes = tl.arange(0, 16)
    sq = tl.zeros([16, 16], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = residual_sum(routed_ptr, delta_ptr, res_ptr, ks, k_ok, K, TOP_K, MODE, dtype, CG)  # [BK]
        a = tl.where(lanes[:, None] == 0, x[None, :], 0.0).to(dtype)  # [16, BK]: the row, then zeros
        sq = tl.dot(a, tl.trans(a), sq, input_precision=PRECISION)
    # element (0, 0); every other element is 0 (squares are never -0.0), so the sum adds only zeros
    return tl.sum(tl.sum(tl.where((lanes[:, None] == 0) & (lanes[None, :] == 0), sq, 0.0), axis=1), axis=0)


@triton.jit
def _dot_step(a, w_ptr, rn, n_ok, ks, k_ok, K, acc, total, kb, k_blocks, CHUNK_BLOCKS: tl.constexpr,
              PRECISION: tl.constexpr):
    """One block_k step of the invariant linear's order (linear.py's _linear_kernel): a [16, BK] (the
    row, then zeros) times the weight's columns rn over ks, into the chunk's sum; at a chunk's end the
    chunk's sum joins the total. Returns (acc, total)."""
    b = tl.load(w_ptr + rn[None, :].to(tl.int64) * K + ks[:, None], mask=k_ok[:, None] & n_ok[None, :],
                other=0.0)  # [BK, BN]
    acc = tl.dot(a, b, acc, input_precision=PRECISION)
    end = ((kb + 1) % CHUNK_BLOCKS == 0) | (kb == k_blocks - 1)  # a chunk ends (a select, not a branch)
    return tl.where(end, 0.0, acc), tl.where(end, total + acc, total)


@triton.jit
def _dot_norm_kernel(routed_ptr, delta_ptr, res_ptr, norm_w_ptr, out_ptr, x_out_ptr, K, eps,
                     TOP_K: tl.constexpr, MODE: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    dtype = out_ptr.dtype.element_ty
    routed_ptr += row * TOP_K * K
    delta_ptr += row * K
    res_ptr += row * K
    scale = tl.rsqrt(_sum_squares(routed_ptr, delta_ptr, res_ptr, K, TOP_K, MODE, dtype, BLOCK_K, PRECISION) / K + eps)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = residual_sum(routed_ptr, delta_ptr, res_ptr, ks, k_ok, K, TOP_K, MODE, dtype)
        if MODE != 0:
            tl.store(x_out_ptr + row * K + ks, x, mask=k_ok)
        tl.store(out_ptr + row * K + ks, normed(x, scale, norm_w_ptr, ks, k_ok, dtype), mask=k_ok)


@triton.jit
def _norm_linear_kernel(routed_ptr, delta_ptr, res_ptr, norm_w_ptr, w_ptr, out_ptr, x_out_ptr, ids_ptr, N, K, eps,
                        TOP_K: tl.constexpr, MODE: tl.constexpr, EMBED: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, CHUNK_BLOCKS: tl.constexpr, PRECISION: tl.constexpr):
    # program j: columns [j * BLOCK_N, (j + 1) * BLOCK_N) of the projection; EMBED (MODE 0): res_ptr
    # is the embedding table and the row the token's, ids_ptr[0]
    j = tl.program_id(0)
    dtype = x_out_ptr.dtype.element_ty
    if EMBED:
        res_ptr += tl.load(ids_ptr).to(tl.int64) * K
    lanes = tl.arange(0, 16)
    rn = j * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    scale = tl.rsqrt(_sum_squares(routed_ptr, delta_ptr, res_ptr, K, TOP_K, MODE, dtype, BLOCK_K, PRECISION) / K + eps)
    k_blocks = tl.cdiv(K, BLOCK_K)
    total = tl.zeros([16, BLOCK_N], tl.float32)
    acc = tl.zeros([16, BLOCK_N], tl.float32)
    for kb in range(0, k_blocks):
        ks = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = residual_sum(routed_ptr, delta_ptr, res_ptr, ks, k_ok, K, TOP_K, MODE, dtype)
        if (MODE != 0 or EMBED) and j == 0:
            tl.store(x_out_ptr + ks, x, mask=k_ok)
        h = normed(x, scale, norm_w_ptr, ks, k_ok, dtype)
        a = tl.where(lanes[:, None] == 0, h[None, :], 0.0).to(dtype)  # [16, BK]: the row, then zeros
        acc, total = _dot_step(a, w_ptr, rn, n_ok, ks, k_ok, K, acc, total, kb, k_blocks, CHUNK_BLOCKS, PRECISION)
    # row 0 of the tile, stored as the linear stores its rows (the total rounded once)
    tl.store(out_ptr + lanes[:, None] * 0 + rn[None, :], total.to(out_ptr.dtype.element_ty),
             mask=(lanes[:, None] == 0) & n_ok[None, :])


@triton.jit
def _linear_norm_kernel(v_ptr, w_ptr, res_ptr, norm_w_ptr, o_ptr, h_out_ptr, x_out_ptr, count_ptr, N, K, eps,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK_BLOCKS: tl.constexpr,
                        PRECISION: tl.constexpr):
    # program j: o_proj's columns [j * BLOCK_N, (j + 1) * BLOCK_N) over the whole value row, as
    # _linear_kernel sums them; the program taking the last ticket adds the residual and normalises
    j = tl.program_id(0)
    dtype = o_ptr.dtype.element_ty
    lanes = tl.arange(0, 16)
    rn = j * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    k_blocks = tl.cdiv(K, BLOCK_K)
    total = tl.zeros([16, BLOCK_N], tl.float32)
    acc = tl.zeros([16, BLOCK_N], tl.float32)
    for kb in range(0, k_blocks):
        ks = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(v_ptr + lanes[:, None] * 0 + ks[None, :], mask=(lanes[:, None] == 0) & k_ok[None, :],
                    other=0.0)  # [16, BK]: the row, then zeros
        acc, total = _dot_step(a, w_ptr, rn, n_ok, ks, k_ok, K, acc, total, kb, k_blocks, CHUNK_BLOCKS, PRECISION)
    tl.store(o_ptr + lanes[:, None] * 0 + rn[None, :], total.to(dtype), mask=(lanes[:, None] == 0) & n_ok[None, :])
    if last_to_finish(count_ptr, tl.num_programs(0)):
        scale = tl.rsqrt(_sum_squares(o_ptr, o_ptr, res_ptr, N, 1, 1, dtype, BLOCK_K, PRECISION, True) / N + eps)
        for k0 in range(0, N, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < N
            x = residual_sum(o_ptr, o_ptr, res_ptr, ks, k_ok, N, 1, 1, dtype, True)
            tl.store(x_out_ptr + ks, x, mask=k_ok)
            tl.store(h_out_ptr + ks, normed(x, scale, norm_w_ptr, ks, k_ok, dtype), mask=k_ok)
        tl.store(count_ptr, 0)  # every program has taken its ticket: ready for the next launch


def _delta_args(delta, residual: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor, int]:
    """(MODE, routed, delta, TOP_K) of residual_sum for delta: None, a [T, K] tensor, or a MoE
    layer's (routed [T, k, K] float32, shared [T, K])."""
    if delta is None:
        return 0, residual, residual, 1
    if isinstance(delta, tuple):
        return 2, delta[0].contiguous(), delta[1].contiguous(), delta[0].shape[1]
    return 1, residual, delta.contiguous(), 1


def _precision(dt: torch.dtype) -> str:
    return "ieee" if dt == torch.float32 else "tf32"  # tf32: the default, unused for bf16


def dot_norm(delta, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, tiling: LinearTiling
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """residual [T, K] plus delta (as norm_linear's) -> (norm(x) * norm_weight, x), x = residual +
    delta (residual itself without a delta), the sum of squares by tl.dot in tiling.block_k steps.
    One launch, a program a row, graph-safe."""
    t, k = residual.shape
    residual = residual.contiguous()
    mode, routed, d, top_k = _delta_args(delta, residual)
    out = torch.empty_like(residual)
    x_out = torch.empty_like(residual) if mode else residual
    if t:
        _dot_norm_kernel[(t,)](routed, d, residual, norm_weight, out, x_out, k, eps, TOP_K=top_k, MODE=mode,
                               BLOCK_K=tiling.block_k, PRECISION=_precision(residual.dtype))
    return out, x_out


def norm_linear(delta, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                tiling: LinearTiling, *, block_n: int = 16, num_warps: int = 4, token: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """One row: (triton_linear(dot_norm(delta, residual, ...)[0], weight, tiling) [1, N], x [1, K]) in
    one launch with the same bits. delta: None, a [1, K] tensor, or a MoE layer's (routed [1, k, K]
    float32, shared [1, K]); weight [N, K] contiguous; block_n: columns a program (no bits change).
    token ([1] int64, delta None): the first layer's form, residual is the embedding table [V, K] and
    x its row token[0] (as F.embedding, no launch of its own)."""
    if token is not None and (delta is not None or token.shape != (1,)):
        raise ValueError("norm_linear reads an embedding row for one token and no delta")
    t, k = (1, residual.shape[1]) if token is not None else residual.shape
    n = weight.shape[0]
    if t != 1 or not weight.is_contiguous() or weight.shape[1] != k or weight.dtype != residual.dtype:
        raise ValueError(f"norm_linear takes one row and a contiguous [N, {k}] weight of its dtype")
    residual = residual.contiguous()
    mode, routed, d, top_k = _delta_args(delta, residual)
    out = torch.empty(1, n, dtype=weight.dtype, device=weight.device)
    x_out = torch.empty(1, k, dtype=residual.dtype, device=residual.device) if mode or token is not None else residual
    _norm_linear_kernel[(triton.cdiv(n, block_n),)](
        routed, d, residual, norm_weight, weight, out, x_out, residual if token is None else token, n, k, eps,
        TOP_K=top_k, MODE=mode, EMBED=token is not None, BLOCK_N=block_n, BLOCK_K=tiling.block_k,
        CHUNK_BLOCKS=tiling.k_chunk // tiling.block_k, PRECISION=_precision(weight.dtype), num_warps=num_warps)
    return out, x_out


def linear_norm(v: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                count: torch.Tensor, tiling: LinearTiling, *, block_n: int = 16, num_warps: int = 4
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """One row: v [1, K] (the merged value heads), weight [N, K] (o_proj), residual [1, N]; count: one
    ticket (engine/kernels/ticket.py). Returns dot_norm(triton_linear(v, weight, tiling), residual,
    norm_weight, eps, tiling), the same bits, in one launch: (norm(residual + o) * norm_weight,
    residual + o)."""
    n, k = weight.shape
    if v.shape != (1, k) or residual.shape != (1, n) or not weight.is_contiguous() or count.numel() < 1:
        raise ValueError(f"linear_norm takes one row: v [1, {k}], residual [1, {n}], a contiguous weight, a ticket")
    if not v.dtype == weight.dtype == residual.dtype:
        raise ValueError(f"linear_norm takes v, weight and residual of one dtype: {v.dtype}, {weight.dtype}, "
                         f"{residual.dtype}")
    residual, v = residual.contiguous(), v.contiguous()
    o, h_out, x_out = torch.empty_like(residual), torch.empty_like(residual), torch.empty_like(residual)
    _linear_norm_kernel[(triton.cdiv(n, block_n),)](
        v, weight, residual, norm_weight, o, h_out, x_out, count, n, k, eps, BLOCK_N=block_n, BLOCK_K=tiling.block_k,
        CHUNK_BLOCKS=tiling.k_chunk // tiling.block_k, PRECISION=_precision(weight.dtype), num_warps=num_warps)
    return h_out, x_out
