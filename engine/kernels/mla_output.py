"""The end of an MLA decode layer at a few rows, in one launch: merge the split kernel's partial
outputs (engine/kernels/mla_decode.py), apply W_UV, the output projection, the residual add and the
post-attention RMSNorm. In the step this replaces three launches (the merge, cuBLAS's o_proj GEMV
and the norm), each of which cost a few µs above its bytes at one row.

Program (row, output block j, head h) merges head h, multiplies it into its 128 value columns and
those into o_proj's columns of head h for output block j: a float32 partial sum per head. The last
of a block's NH programs to finish (an atomic ticket; it only decides who adds, not the order) adds
the NH partials in head order, so the bits do not depend on which program came last, and rounds
the block of o_proj's output. The last block of a row then adds the residual and normalises the
row. Each program recomputes its head's value columns (W_UV[h] from L2, once per output block):
what a program needs of o_proj, it reads once.

Rounding is the unfused path's: the merged latent rounded to the model dtype, the value head
accumulated in float32 and rounded, o_proj accumulated in float32 and rounded, the residual sum
rounded, then RMSNorm as engine/kernels/rmsnorm.py. Only the order of float32 sums differs."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 4  # above this many rows cuBLAS's o_proj and the separate kernels win (more rows per weight read)
MAX_SPLITS = 32  # every program merges its head over all splits; long contexts at one row get fewer, longer splits
BLOCK_J = 256  # o_proj output columns per program: 8 blocks x 16 heads = 128 programs per row at lite's shapes
EARLY_WO = True  # load o_proj's tile before the merge (latency hidden) or after it (fewer live registers)
NUM_WARPS = 8
MODE = "fused"  # or "gemv": the merge kernel with W_UV, then o_proj, the add and the norm in one launch (proj_norm)


@triton.jit
def _output_kernel(part_o_ptr, part_ml_ptr, w_uv_ptr, w_o_ptr, res_ptr, norm_w_ptr, partial_ptr, o_ptr, h_out_ptr,
                   x_out_ptr, count_ptr, eps,
                   NH: tl.constexpr, NH_P: tl.constexpr, RANK: tl.constexpr, NSPLIT: tl.constexpr, NSPLIT_P: tl.constexpr,
                   V: tl.constexpr, V_P: tl.constexpr, HID: tl.constexpr, HID_P: tl.constexpr,
                   BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr, EARLY_WO: tl.constexpr):
    b = tl.program_id(0)
    j = tl.program_id(1)
    h = tl.program_id(2)
    nj = tl.num_programs(1)
    dtype = o_ptr.dtype.element_ty
    r = j * BLOCK_J + tl.arange(0, BLOCK_J)  # [BJ] output columns of o_proj
    r_ok = r < HID
    c = tl.arange(0, V_P)  # value columns of head h
    c_ok = c < V
    w_o_at = w_o_ptr + r[:, None] * (NH * V) + h * V + c[None, :]  # [BJ, V_P] head h's columns of o_proj
    wo_mask = r_ok[:, None] & c_ok[None, :]
    if EARLY_WO:  # they depend on nothing: their load can go out first
        w_o = tl.load(w_o_at, mask=wo_mask, other=0.0)
    # the splits' weights: exp(max_s - max) where the split saw keys, 0 where it saw none
    sp = tl.arange(0, NSPLIT_P)
    sp_ok = sp < NSPLIT
    idx = (b * NSPLIT + sp) * NH + h  # [S_P] row of each split's (max, sum) and latent
    ms = tl.load(part_ml_ptr + idx * 2, mask=sp_ok, other=float("-inf"))
    m = tl.max(ms, axis=0)
    w = tl.where(ms == float("-inf"), 0.0, tl.exp(ms - m))  # [S_P]
    total = tl.sum(tl.load(part_ml_ptr + idx * 2 + 1, mask=sp_ok, other=0.0) * w, axis=0)
    acc = tl.zeros([BLOCK_K, V_P], tl.float32)  # per-lane sums over the latent chunks, added up once
    for k0 in tl.static_range(0, RANK, BLOCK_K):
        dk = k0 + tl.arange(0, BLOCK_K)
        k_ok = dk < RANK
        part = tl.load(part_o_ptr + idx[:, None] * RANK + dk[None, :], mask=sp_ok[:, None] & k_ok[None, :],
                       other=0.0)  # [S_P, BK]
        o_lat = (tl.sum(tl.where(w[:, None] > 0, part * w[:, None], 0.0), axis=0) / total).to(dtype)  # [BK]
        w_uv = tl.load(w_uv_ptr + h * RANK * V + dk[:, None] * V + c[None, :], mask=k_ok[:, None] & c_ok[None, :],
                       other=0.0)  # [BK, V_P]
        acc += o_lat.to(tl.float32)[:, None] * w_uv.to(tl.float32)
    v = tl.sum(acc, axis=0).to(dtype).to(tl.float32)  # [V_P] the value head, rounded as the merge kernel's output is
    if not EARLY_WO:
        w_o = tl.load(w_o_at, mask=wo_mask, other=0.0)
    part_out = tl.sum(w_o.to(tl.float32) * v[None, :], axis=1)  # [BJ] head h's share of o_proj
    tl.store(partial_ptr + (b * NH + h) * HID + r, part_out, mask=r_ok)
    tl.debug_barrier()  # every thread's partial is written before the ticket is taken
    block_count = count_ptr + b * (nj + 1) + j
    if tl.atomic_add(block_count, 1, sem="acq_rel", scope="gpu") == NH - 1:
        heads = tl.arange(0, NH_P)
        parts = tl.load(partial_ptr + (b * NH + heads[:, None]) * HID + r[None, :],
                        mask=(heads < NH)[:, None] & r_ok[None, :], other=0.0, cache_modifier=".cg")  # [NH_P, BJ]
        # one fixed reduction tree over the heads, whichever program came last
        tl.store(o_ptr + b * HID + r, tl.sum(parts, axis=0).to(dtype), mask=r_ok)
        tl.store(block_count, 0)  # every program of the block has taken its ticket: ready for the next launch
        tl.debug_barrier()
        row_count = count_ptr + b * (nj + 1) + nj
        if tl.atomic_add(row_count, 1, sem="acq_rel", scope="gpu") == nj - 1:
            _add_norm(o_ptr, res_ptr, norm_w_ptr, h_out_ptr, x_out_ptr, row_count, b, eps, HID, HID_P)


@triton.jit
def _add_norm(o_ptr, res_ptr, norm_w_ptr, h_out_ptr, x_out_ptr, row_count, b, eps, HID: tl.constexpr,
              HID_P: tl.constexpr):
    """The row's last block: residual + o_proj's output, rounded, then RMSNorm (rmsnorm.py's rounding);
    the row's ticket back to zero."""
    dtype = o_ptr.dtype.element_ty
    cols = tl.arange(0, HID_P)
    ok = cols < HID
    delta = tl.load(o_ptr + b * HID + cols, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
    x = (delta + tl.load(res_ptr + b * HID + cols, mask=ok, other=0.0).to(tl.float32)).to(dtype)
    tl.store(x_out_ptr + b * HID + cols, x, mask=ok)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / HID
    hn = (xf * tl.rsqrt(var + eps)).to(dtype)
    nw = tl.load(norm_w_ptr + cols, mask=ok, other=0.0)
    tl.store(h_out_ptr + b * HID + cols, (nw.to(tl.float32) * hn.to(tl.float32)).to(dtype), mask=ok)
    tl.store(row_count, 0)


@triton.jit
def _proj_norm_kernel(v_ptr, w_o_ptr, res_ptr, norm_w_ptr, o_ptr, h_out_ptr, x_out_ptr, count_ptr, eps,
                      K: tl.constexpr, HID: tl.constexpr, HID_P: tl.constexpr, BLOCK_J: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    # the "gemv" form: program (row, j) computes o_proj's output block j over the whole merged value
    # row (merge kernel's output), no partial sums; the row's last block adds and normalises
    b = tl.program_id(0)
    j = tl.program_id(1)
    nj = tl.num_programs(1)
    r = j * BLOCK_J + tl.arange(0, BLOCK_J)
    r_ok = r < HID
    acc = tl.zeros([BLOCK_J, BLOCK_K], tl.float32)
    for k0 in tl.static_range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        w_o = tl.load(w_o_ptr + r[:, None] * K + ks[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        v = tl.load(v_ptr + b * K + ks, mask=k_ok, other=0.0).to(tl.float32)
        acc += w_o.to(tl.float32) * v[None, :]
    tl.store(o_ptr + b * HID + r, tl.sum(acc, axis=1).to(o_ptr.dtype.element_ty), mask=r_ok)
    tl.debug_barrier()
    row_count = count_ptr + b
    if tl.atomic_add(row_count, 1, sem="acq_rel", scope="gpu") == nj - 1:
        _add_norm(o_ptr, res_ptr, norm_w_ptr, h_out_ptr, x_out_ptr, row_count, b, eps, HID, HID_P)


def counters(hidden: int, device: torch.device, block_j: int = BLOCK_J) -> torch.Tensor:
    """The tickets one layer's launches share: per row, one per output block and one for the row.
    Zero at rest (every launch leaves them at zero), so a CUDA graph replays with no memset."""
    return torch.zeros(MAX_ROWS * (triton.cdiv(hidden, block_j) + 1), dtype=torch.int32, device=device)


def mla_output(part_o: torch.Tensor, part_ml: torch.Tensor, w_uv_t: torch.Tensor, o_proj: torch.Tensor,
               residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, count: torch.Tensor,
               block_j: int = BLOCK_J, early_wo: bool = EARLY_WO, num_warps: int = NUM_WARPS
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """part_o [B, S, H, rank], part_ml [B, S, H, 2]: mla_split's; w_uv_t [H, rank, V]; o_proj
    [HID, H*V]; residual [B, HID]; norm_weight [HID]; count: counters(HID, ...). With
    delta = o_proj(merge @ W_UV): returns (norm(residual + delta) * norm_weight, residual + delta),
    as engine/kernels/rmsnorm.py's rmsnorm(delta, ..., residual=) would. One launch, graph-safe."""
    b, n_splits, nh, rank = part_o.shape
    v = w_uv_t.shape[2]
    hid = o_proj.shape[0]
    assert b <= MAX_ROWS and n_splits <= MAX_SPLITS and o_proj.shape[1] == nh * v, (b, n_splits, o_proj.shape)
    assert w_uv_t.is_contiguous() and o_proj.is_contiguous() and count.numel() >= b * (triton.cdiv(hid, block_j) + 1)
    residual = residual.contiguous()
    partial = torch.empty(b, nh, hid, dtype=torch.float32, device=part_o.device)  # [B, H, HID] per head
    o = torch.empty_like(residual)  # [B, HID] o_proj's output
    h_out, x_out = torch.empty_like(residual), torch.empty_like(residual)
    _output_kernel[(b, triton.cdiv(hid, block_j), nh)](
        part_o, part_ml, w_uv_t, o_proj, residual, norm_weight, partial, o, h_out, x_out, count, eps,
        NH=nh, NH_P=triton.next_power_of_2(nh), RANK=rank, NSPLIT=n_splits, NSPLIT_P=triton.next_power_of_2(n_splits), V=v,
        V_P=triton.next_power_of_2(v), HID=hid, HID_P=triton.next_power_of_2(hid), BLOCK_J=block_j,
        BLOCK_K=min(64, triton.next_power_of_2(rank)), EARLY_WO=early_wo, num_warps=num_warps)
    return h_out, x_out


def proj_norm(v: torch.Tensor, o_proj: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
              count: torch.Tensor, block_j: int = 16, block_k: int = 512, num_warps: int = 4
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The "gemv" form: v [B, H*V] (the merge kernel's output with W_UV applied) through o_proj, the
    residual add and the norm in one launch. Returns what mla_output returns."""
    b, k = v.shape
    hid = o_proj.shape[0]
    assert b <= MAX_ROWS and v.is_contiguous() and o_proj.is_contiguous() and count.numel() >= b
    residual = residual.contiguous()
    o, h_out, x_out = torch.empty_like(residual), torch.empty_like(residual), torch.empty_like(residual)
    _proj_norm_kernel[(b, triton.cdiv(hid, block_j))](
        v, o_proj, residual, norm_weight, o, h_out, x_out, count, eps, K=k, HID=hid,
        HID_P=triton.next_power_of_2(hid), BLOCK_J=block_j, BLOCK_K=min(block_k, triton.next_power_of_2(k)),
        num_warps=num_warps)
    return h_out, x_out
