"""The end of an MLA decode layer at one row, in one launch: o_proj over the merged value heads
(the merge kernel's output, engine/kernels/mla_decode.py), the residual add and the post-attention
RMSNorm. At one row cuBLAS's o_proj GEMV and the norm kernel cost a few µs each above their bytes;
here each program computes a block of o_proj's output columns, and the last block to finish
(engine/kernels/ticket.py) adds the residual and normalises the row, so the norm needs no launch
of its own.

Rounding is the separate kernels': o_proj accumulated in float32 and rounded to the model dtype
(in another summation order than cuBLAS), the residual sum rounded, then RMSNorm as
engine/kernels/rmsnorm.py does it. Measured on the H200 (docs/perf-notes.md row 24): at one row
this form saved ~1.6 µs a layer; at four rows it lost to cuBLAS, hence KernelConfig.mla_output_rows
(1; its tiling: KernelConfig.mla_output). A single launch that also merged the splits and applied
W_UV (partial sums per head) was slower at every size."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pegainfer.engine.kernels.config import RowTiling
from pegainfer.engine.kernels.rmsnorm import norm_store
from pegainfer.engine.kernels.ticket import last_to_finish


@triton.jit
def _proj_norm_kernel(v_ptr, w_o_ptr, res_ptr, norm_w_ptr, o_ptr, h_out_ptr, x_out_ptr, count_ptr, eps,
                      K: tl.constexpr, HID: tl.constexpr, HID_P: tl.constexpr, BLOCK_J: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    # program (row, j): o_proj's output block j over the whole value row; the row's last block adds
    # the residual and normalises
    b = tl.program_id(0)
    j = tl.program_id(1)
    nj = tl.num_programs(1)
    dtype = o_ptr.dtype.element_ty
    r = j * BLOCK_J + tl.arange(0, BLOCK_J)  # [BJ] output columns
    r_ok = r < HID
    acc = tl.zeros([BLOCK_J, BLOCK_K], tl.float32)  # per-lane sums over the steps, added up once
    for k0 in tl.static_range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        w_o = tl.load(w_o_ptr + r[:, None] * K + ks[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        v = tl.load(v_ptr + b * K + ks, mask=k_ok, other=0.0).to(tl.float32)
        acc += w_o.to(tl.float32) * v[None, :]
    tl.store(o_ptr + b * HID + r, tl.sum(acc, axis=1).to(dtype), mask=r_ok)
    if last_to_finish(count_ptr + b, nj):
        cols = tl.arange(0, HID_P)
        ok = cols < HID
        delta = tl.load(o_ptr + b * HID + cols, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
        x = (delta + tl.load(res_ptr + b * HID + cols, mask=ok, other=0.0).to(tl.float32)).to(dtype)
        tl.store(x_out_ptr + b * HID + cols, x, mask=ok)
        norm_store(x, norm_w_ptr, h_out_ptr + b * HID, cols, ok, HID, eps)
        tl.store(count_ptr + b, 0)  # every block has taken its ticket: ready for the next launch


def proj_norm(v: torch.Tensor, o_proj: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
              count: torch.Tensor, tiling: RowTiling) -> tuple[torch.Tensor, torch.Tensor]:
    """v [B, nh*V]: the merged value heads; o_proj [HID, nh*V]; residual [B, HID]; norm_weight [HID];
    count: engine/kernels/ticket.py's tickets, one per row. With delta = o_proj(v) returns
    (norm(residual + delta) * norm_weight, residual + delta), as rmsnorm(delta, norm_weight, eps,
    residual=residual). One launch, graph-safe. tiling: output columns per program (256 programs at
    lite's 2048 with 8), the K block (with 4 warps an [8, 512] tile is 32 values per thread), warps."""
    block_j, block_k, num_warps = tiling.block_j, tiling.block_k, tiling.num_warps
    b, k = v.shape
    hid = o_proj.shape[0]
    assert b <= count.numel() and v.is_contiguous() and o_proj.is_contiguous() and o_proj.shape[1] == k
    residual = residual.contiguous()
    o, h_out, x_out = torch.empty_like(residual), torch.empty_like(residual), torch.empty_like(residual)
    _proj_norm_kernel[(b, triton.cdiv(hid, block_j))](
        v, o_proj, residual, norm_weight, o, h_out, x_out, count, eps, K=k, HID=hid,
        HID_P=triton.next_power_of_2(hid), BLOCK_J=block_j, BLOCK_K=min(block_k, triton.next_power_of_2(k)),
        num_warps=num_warps)
    return h_out, x_out
