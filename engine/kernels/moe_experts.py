"""The routed experts' SwiGLU MLP as three Triton launches with no host synchronisation, for the
small batches of the decode step (vLLM's fused_moe is the model): `align` puts the routes in
expert order with each expert's start and count, `gate_up` runs every expert's gate and up
projections over its rows with SiLU(gate) * up in the epilogue, and `down` runs the down
projection, scales by the route weight and writes each route's float32 output where the caller
wants it. Each program takes one expert and one column block and loops over that expert's rows in
blocks of BLOCK_M, so an expert's weights are read once per block of rows, and experts with no rows
cost one early exit.

Rounding follows the grouped-GEMM path: gate, up, SiLU(gate) and the product are rounded to the
model dtype, the down projection is rounded to it, then multiplied by the float32 route weight.
A row's result does not depend on which other rows share its block (fixed K order), so every
backend that runs its experts here gets the same bits for the same route."""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

@dataclasses.dataclass(frozen=True, slots=True)
class Tiling:
    """Launch shape of the two GEMM kernels. One tiling serves every batch size (it is not chosen
    per step), so a route's bits never depend on what else is in the batch; block_k fixes the K
    order of every dot product. tools/kernel_bench.py --sweep times the candidates on the GPU."""
    block_m: int = 32  # rows of one expert per block
    block_k: int = 128
    up_n: int = 64
    down_n: int = 64
    num_warps: int = 4
    num_stages: int = 3


# Measured on the H200 (tools/kernel_bench.py --sweep, docs/perf-notes.md): of 24 tilings, this one
# is within 8 % of the best at every batch size of 1, 8, 64 and 256 tokens.
TILING = Tiling()
# Above this many routes on one rank (prompt chunks, not decode steps) each program would loop over
# many row blocks re-reading its weights; ExpertShard hands such calls to grouped GEMMs instead.
MAX_ROUTES = 2048


@triton.jit
def _align_kernel(ids_ptr, order_ptr, starts_ptr, counts_ptr, totals_ptr, R, BLOCK: tl.constexpr):
    """Program e: its routes' positions in expert order (stable), its start and its count."""
    e = tl.program_id(0)
    start = tl.zeros([BLOCK], tl.int32)
    for r0 in range(0, R, BLOCK):
        rs = r0 + tl.arange(0, BLOCK)
        ids = tl.load(ids_ptr + rs, mask=rs < R, other=2147483647)
        start += (ids < e).to(tl.int32)
    first = tl.sum(start, axis=0)
    seen = tl.zeros([BLOCK], tl.int32)
    for r0 in range(0, R, BLOCK):
        rs = r0 + tl.arange(0, BLOCK)
        hit = tl.load(ids_ptr + rs, mask=rs < R, other=2147483647) == e
        before = tl.sum(seen, axis=0)
        pos = first + before + tl.cumsum(hit.to(tl.int32), axis=0) - 1
        tl.store(order_ptr + pos, rs, mask=hit)
        seen += hit.to(tl.int32)
    count = tl.sum(seen, axis=0)
    tl.store(starts_ptr + e, first)
    tl.store(counts_ptr + e, count)
    tl.store(totals_ptr + e, tl.load(totals_ptr + e) + count)  # one program per expert: no race


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, order_ptr, starts_ptr, counts_ptr, act_ptr, H, I, stride_we, TOPK,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    e = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < I
    count = tl.load(counts_ptr + e)
    start = tl.load(starts_ptr + e)
    w_gate = w_ptr + e.to(tl.int64) * stride_we + n[None, :] * H  # rows [0, I) gate, [I, 2I) up
    w_up = w_gate + I * H
    for m0 in range(0, count, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        r_ok = rows < count
        token = tl.load(order_ptr + start + rows, mask=r_ok, other=0) // TOPK  # [BLOCK_M]
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, H, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < H
            x = tl.load(x_ptr + token[:, None].to(tl.int64) * H + ks[None, :],
                        mask=r_ok[:, None] & k_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
            wmask = k_ok[:, None] & n_ok[None, :]
            acc_g = tl.dot(x, tl.load(w_gate + ks[:, None], mask=wmask, other=0.0), acc_g)  # [BLOCK_K, BLOCK_N]
            acc_u = tl.dot(x, tl.load(w_up + ks[:, None], mask=wmask, other=0.0), acc_u)
        dtype = act_ptr.dtype.element_ty
        g = acc_g.to(dtype).to(tl.float32)
        s = (g * tl.sigmoid(g)).to(dtype).to(tl.float32)
        a = (s * acc_u.to(dtype).to(tl.float32)).to(dtype)
        tl.store(act_ptr + (start + rows)[:, None].to(tl.int64) * I + n[None, :], a,
                 mask=r_ok[:, None] & n_ok[None, :])


@triton.jit
def _down_kernel(act_ptr, w_ptr, order_ptr, starts_ptr, counts_ptr, weight_ptr, out_ptr, H, I, stride_we,
                 BY_ROUTE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    e = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < H
    count = tl.load(counts_ptr + e)
    start = tl.load(starts_ptr + e)
    w_base = w_ptr + e.to(tl.int64) * stride_we + n[None, :] * I  # w2[e]: [H, I]
    for m0 in range(0, count, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        r_ok = rows < count
        pos = start + rows  # execution-order position
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, I, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < I
            a = tl.load(act_ptr + pos[:, None].to(tl.int64) * I + ks[None, :], mask=r_ok[:, None] & k_ok[None, :],
                        other=0.0)  # [BLOCK_M, BLOCK_K]
            acc = tl.dot(a, tl.load(w_base + ks[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0), acc)
        y = acc.to(act_ptr.dtype.element_ty).to(tl.float32)
        if BY_ROUTE:  # weights and output rows are indexed by route id (token-major)
            dest = tl.load(order_ptr + pos, mask=r_ok, other=0)
        else:  # by execution-order position
            dest = pos
        wt = tl.load(weight_ptr + dest, mask=r_ok, other=0.0)
        tl.store(out_ptr + dest[:, None].to(tl.int64) * H + n[None, :], y * wt[:, None],
                 mask=r_ok[:, None] & n_ok[None, :])


def _mlp(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, order: torch.Tensor, starts: torch.Tensor,
         counts: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, topk: int, by_route: bool,
         tiling: Tiling = TILING) -> torch.Tensor:
    n_exp, two_i, h = w13.shape
    i = two_i // 2
    r = order.shape[0]
    act = torch.empty(r, i, dtype=x.dtype, device=x.device)  # [R, I] in execution order
    _gate_up_kernel[(n_exp, triton.cdiv(i, tiling.up_n))](x, w13, order, starts, counts, act, h, i, w13.stride(0), topk,
                                                       BLOCK_M=tiling.block_m, BLOCK_N=tiling.up_n, BLOCK_K=tiling.block_k,
                                                       num_warps=tiling.num_warps, num_stages=tiling.num_stages)
    _down_kernel[(n_exp, triton.cdiv(h, tiling.down_n))](act, w2, order, starts, counts, weight, out, h, i, w2.stride(0),
                                                      BY_ROUTE=by_route, BLOCK_M=tiling.block_m, BLOCK_N=tiling.down_n,
                                                      BLOCK_K=tiling.block_k, num_warps=tiling.num_warps,
                                                      num_stages=tiling.num_stages)
    return out


def fused_experts_token_major(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                              ids: torch.Tensor, totals: torch.Tensor, tiling: Tiling = TILING) -> torch.Tensor:
    """Every route of every token through its expert (one rank owns them all).
    x: [T, H]; w13: [E, 2I, H]; w2: [E, H, I]; weights: [T, k] float32; ids: [T, k] int32 (expert of
    each route); totals: [E] int64, routes per expert accumulated here. Returns [T, k, H] float32,
    route (t, j) at [t, j]."""
    t, k = ids.shape
    r = t * k
    n_exp = w13.shape[0]
    order = torch.empty(r, dtype=torch.int32, device=x.device)  # execution position -> route id
    starts = torch.empty(n_exp, dtype=torch.int32, device=x.device)
    counts = torch.empty(n_exp, dtype=torch.int32, device=x.device)
    _align_kernel[(n_exp,)](ids.reshape(-1), order, starts, counts, totals, r, BLOCK=256)
    out = torch.empty(r, x.shape[1], dtype=torch.float32, device=x.device)
    _mlp(x.contiguous(), w13, w2, order, starts, counts, weights.reshape(-1).contiguous(), out, k, by_route=True,
         tiling=tiling)
    return out.view(t, k, x.shape[1])


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, token_index: torch.Tensor,
                  weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """A shard's routes, already in expert order (the RoutePlan's execution order).
    x: [T, H]; token_index, weight: [R] per route; counts: [n] routes per owned expert (device).
    Returns [R, H] float32 in the same order."""
    counts = counts.to(torch.int32)
    starts = torch.cumsum(counts, 0, dtype=torch.int32) - counts  # [n]
    out = torch.empty(token_index.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    return _mlp(x.contiguous(), w13, w2, token_index.to(torch.int32), starts, counts, weight.float().contiguous(),
                out, 1, by_route=False)
