"""Fused (residual add +) RMSNorm: one launch instead of seven, with the reference's rounding —
normalise in float32, round to the model dtype, then multiply by the weight and round again."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def norm_store(x, w_ptr, out_ptr, cols, mask, n_cols, eps):
    """x: a row in the model dtype (zero where masked). Stores norm(x) * weight at out_ptr + cols
    with the reference's rounding."""
    dtype = out_ptr.dtype.element_ty
    h = x.to(tl.float32)
    var = tl.sum(h * h, axis=0) / n_cols
    h = (h * tl.rsqrt(var + eps)).to(dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + cols, (w.to(tl.float32) * h.to(tl.float32)).to(dtype), mask=mask)


@triton.jit
def residual_sum(routed_ptr, delta_ptr, res_ptr, cols, mask, n_cols, TOP_K: tl.constexpr, MODE: tl.constexpr,
                 dtype: tl.constexpr, CG: tl.constexpr = False):
    """The residual stream's new values at cols, rounded to dtype as the torch ops are. MODE 0: the
    residual itself; 1: + delta; 2: + a MoE layer's output: its TOP_K routes ([TOP_K, n_cols] float32
    at routed_ptr) summed in route order and rounded, plus the shared experts (delta), rounded. CG:
    the delta read past L1 (other programs of the same launch wrote it: norm_linear's ticketed tail)."""
    res = tl.load(res_ptr + cols, mask=mask, other=0.0)
    if MODE == 0:
        return res
    if CG:
        d = tl.load(delta_ptr + cols, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    else:
        d = tl.load(delta_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if MODE == 2:
        acc = tl.load(routed_ptr + cols, mask=mask, other=0.0)
        for j in tl.static_range(1, TOP_K):  # the fixed-order combine: route 0, then 1, ...
            acc += tl.load(routed_ptr + j * n_cols + cols, mask=mask, other=0.0)
        d = (acc.to(dtype).to(tl.float32) + d).to(dtype).to(tl.float32)
    return (d + res.to(tl.float32)).to(dtype)


@triton.jit
def _rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, n_cols, eps,
                    HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    # without a residual the caller passes x as res_ptr: MODE 0 reads the row itself
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = residual_sum(x_ptr, x_ptr + row * n_cols, res_ptr + row * n_cols, cols, mask, n_cols, 1,
                     1 if HAS_RES else 0, res_out_ptr.dtype.element_ty)
    if HAS_RES:
        tl.store(res_out_ptr + row * n_cols + cols, x, mask=mask)
    norm_store(x, w_ptr, out_ptr + row * n_cols, cols, mask, n_cols, eps)


@triton.jit
def _moe_rmsnorm_kernel(routed_ptr, shared_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, n_cols, eps,
                        TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = residual_sum(routed_ptr + row * TOP_K * n_cols, shared_ptr + row * n_cols, res_ptr + row * n_cols, cols, mask,
                     n_cols, TOP_K, 2, out_ptr.dtype.element_ty)
    tl.store(res_out_ptr + row * n_cols + cols, x, mask=mask)
    norm_store(x, w_ptr, out_ptr + row * n_cols, cols, mask, n_cols, eps)


def moe_rmsnorm(routed: torch.Tensor, shared: torch.Tensor, weight: torch.Tensor, eps: float,
                residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The MoE layer's combine folded into the next norm: routed [T, k, N] float32 per route (summed
    in route order, rounded), shared [T, N]; delta = routed + shared. Returns (norm(residual + delta)
    * weight, residual + delta)."""
    t, k, n = routed.shape
    out = torch.empty_like(residual)
    res_out = torch.empty_like(residual)
    _moe_rmsnorm_kernel[(t,)](routed.contiguous(), shared.contiguous(), residual.contiguous(), weight, out, res_out,
                              n, eps, TOP_K=k, BLOCK=triton.next_power_of_2(n))
    return out, res_out


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float,
            residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [T, N]. Returns (norm(x + residual) * weight, x + residual); without a residual the
    second value is x itself."""
    x = x.contiguous()
    t, n = x.shape
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else x
    _rmsnorm_kernel[(t,)](x, residual if residual is not None else x, weight, out, res_out, n, eps,
                          HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(n))
    return out, res_out
