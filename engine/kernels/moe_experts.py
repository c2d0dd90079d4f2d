"""The routed experts' SwiGLU MLP as two Triton launches with no host synchronisation, for the
small batches of the decode step (vLLM's fused_moe is the model), over routes already listed by
expert (an Alignment: the router's kernels fill it in the decode step; an EP shard's route plan
gives it in execution order): `gate_up` runs every expert's gate and up projections over its rows
with SiLU(gate) * up in the epilogue, and `down` runs the down projection, scales by the route
weight and writes each route's float32 output where the caller wants it. Each program takes a
slot (an expert, or none past the experts with routes) and one column block and loops over that
expert's rows in blocks of BLOCK_M, so an expert's weights are read once per block of rows.

Rounding follows the grouped-GEMM path: gate, up, SiLU(gate) and the product are rounded to the
model dtype, the down projection is rounded to it, then multiplied by the float32 route weight.
A row's result does not depend on which other rows share its block (fixed K order), so every
backend that runs its experts here gets the same bits for the same route. The tiling is the
caller's, from KernelConfig.experts.tiling_for(the step's total routes) or KernelConfig.dense
(engine/kernels/config.py).

Batch invariance: a route's bits depend on neither the rows beside it in its block nor how many
routes its expert or the step holds. Every tiling ExpertTilings picks keeps block_k = 128, so each
dot product sums its K blocks in the same order, and on sm_90 all of them lower to one mma
instruction (mma.sync m16n8k16, bf16 in, float32 accumulate; 16- and 32-row blocks alike, compiled
offline with Triton 3.9), so the tiling chosen by the step's routes changes the speed, not the bits
(tests/engine/kernels/test_moe_experts.py pins it on the GPU). ExpertShard (ep/experts.py) runs
every size here in batch-invariant mode. dense_swiglu is a one-row kernel: in batch-invariant mode
KernelConfig.on_device turns it off (dense_rows 0)."""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from pegainfer.engine.kernels.config import Tiling

COMPACT_MAX_TOKENS = 16  # up to this many tokens the router lists the active experts first (Alignment)


@dataclasses.dataclass(frozen=True, slots=True)
class Alignment:
    """The routes by expert, as the expert kernels read them; filled on the device by the router's
    kernels (engine/kernels/moe_route.py). Expert e's i-th route is order[starts[e] + i], a route
    id (token-major, t * k + j), ascending within the expert; the router lists each expert at a
    fixed stride (starts[e] = e * T, order: [E * T] int32) so no expert waits for another's count.
    counts: [E] int32; active: [E] int32, the expert of each program slot; totals: [E] int64, routes
    per expert accumulated across calls (the backend's counters); slots: how many program slots the
    expert kernels launch. Up to COMPACT_MAX_TOKENS tokens the router puts the experts with routes
    first, ascending, then -1, and the kernels launch one slot per possible active expert
    (min(E, T * k)); above it every expert has its own slot (nearly all have routes). ticket: [1]
    int32, zero at rest, held by the backend like totals: given, the router makes its logits and
    the selection in one launch at up to COMPACT_MAX_TOKENS tokens (engine/kernels/moe_route.py)."""
    order: torch.Tensor
    starts: torch.Tensor
    counts: torch.Tensor
    active: torch.Tensor
    totals: torch.Tensor
    slots: int
    ticket: torch.Tensor | None = None

    @property
    def compact(self) -> bool:
        """The router lists only the experts with routes in `active` (few tokens)."""
        return self.order.shape[0] <= COMPACT_MAX_TOKENS * self.totals.shape[0]

    @classmethod
    def empty(cls, tokens: int, top_k: int, totals: torch.Tensor, ticket: torch.Tensor | None = None) -> Alignment:
        n, dev = totals.shape[0], totals.device
        slots = min(n, tokens * top_k) if tokens <= COMPACT_MAX_TOKENS else n
        return cls(torch.empty(n * tokens, dtype=torch.int32, device=dev), torch.empty(n, dtype=torch.int32, device=dev),
                   torch.empty(n, dtype=torch.int32, device=dev), torch.empty(n, dtype=torch.int32, device=dev), totals,
                   slots, ticket)


@triton.jit
def _slot(active_ptr, counts_ptr, starts_ptr):
    """Program slot -> (expert, its route count, its start); a slot past the active experts gets a
    count of 0, so its row loop does not run."""
    raw = tl.load(active_ptr + tl.program_id(0))
    e = tl.maximum(raw, 0)
    count = tl.where(raw >= 0, tl.load(counts_ptr + e), 0)
    return e, count, tl.load(starts_ptr + e)


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, order_ptr, starts_ptr, counts_ptr, active_ptr, act_ptr, H, I, stride_we, TOPK,
                    BY_ROUTE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    e, count, start = _slot(active_ptr, counts_ptr, starts_ptr)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < I
    w_gate = w_ptr + e.to(tl.int64) * stride_we + n[None, :] * H  # rows [0, I) gate, [I, 2I) up
    w_up = w_gate + I * H
    for m0 in range(0, count, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        r_ok = rows < count
        src = tl.load(order_ptr + start + rows, mask=r_ok, other=0)  # [BLOCK_M] route id (BY_ROUTE) or token
        token = src // TOPK
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
        dest = src if BY_ROUTE else start + rows  # act rows by route id, or by execution position
        tl.store(act_ptr + dest[:, None].to(tl.int64) * I + n[None, :], a, mask=r_ok[:, None] & n_ok[None, :])


@triton.jit
def _down_kernel(act_ptr, w_ptr, order_ptr, starts_ptr, counts_ptr, active_ptr, weight_ptr, out_ptr, H, I, stride_we,
                 BY_ROUTE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    e, count, start = _slot(active_ptr, counts_ptr, starts_ptr)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < H
    w_base = w_ptr + e.to(tl.int64) * stride_we + n[None, :] * I  # w2[e]: [H, I]
    for m0 in range(0, count, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        r_ok = rows < count
        if BY_ROUTE:  # act, weight and output rows by route id (token-major)
            dest = tl.load(order_ptr + start + rows, mask=r_ok, other=0)
        else:  # by execution-order position
            dest = start + rows
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, I, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < I
            a = tl.load(act_ptr + dest[:, None].to(tl.int64) * I + ks[None, :], mask=r_ok[:, None] & k_ok[None, :],
                        other=0.0)  # [BLOCK_M, BLOCK_K]
            acc = tl.dot(a, tl.load(w_base + ks[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0), acc)
        y = acc.to(act_ptr.dtype.element_ty).to(tl.float32)
        wt = tl.load(weight_ptr + dest, mask=r_ok, other=0.0)
        tl.store(out_ptr + dest[:, None].to(tl.int64) * H + n[None, :], y * wt[:, None],
                 mask=r_ok[:, None] & n_ok[None, :])


def _mlp(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, al: Alignment, slots: int, weight: torch.Tensor,
         out: torch.Tensor, *, topk: int, by_route: bool, tiling: Tiling) -> torch.Tensor:
    """slots: programs along the expert axis (active experts can be no more)."""
    n_exp, two_i, h = w13.shape
    i = two_i // 2
    act = torch.empty(out.shape[0], i, dtype=x.dtype, device=x.device)  # [R, I], rows as out's
    _gate_up_kernel[(slots, triton.cdiv(i, tiling.up_n))](
        x, w13, al.order, al.starts, al.counts, al.active, act, h, i, w13.stride(0), topk, BY_ROUTE=by_route,
        BLOCK_M=tiling.block_m,
        BLOCK_N=tiling.up_n, BLOCK_K=tiling.block_k, num_warps=tiling.num_warps, num_stages=tiling.num_stages)
    _down_kernel[(slots, triton.cdiv(h, tiling.down_n))](
        act, w2, al.order, al.starts, al.counts, al.active, weight, out, h, i, w2.stride(0), BY_ROUTE=by_route,
        BLOCK_M=tiling.block_m, BLOCK_N=tiling.down_n, BLOCK_K=tiling.block_k, num_warps=tiling.num_warps,
        num_stages=tiling.num_stages)
    return out


def fused_experts_token_major(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                              aligned: Alignment, tiling: Tiling) -> torch.Tensor:
    """Every route of every token through its expert (one rank owns them all).
    x: [T, H]; w13: [E, 2I, H]; w2: [E, H, I]; weights: [T, k] float32; aligned: the routes in
    expert order, as the router kernel filled them (fused_route(..., aligned=)); tiling: for the
    T * k routes. Returns [T, k, H] float32, route (t, j) at [t, j]."""
    t, k = weights.shape
    r = t * k
    out = torch.empty(r, x.shape[1], dtype=torch.float32, device=x.device)
    _mlp(x.contiguous(), w13, w2, aligned, aligned.slots, weights.reshape(-1).contiguous(), out, topk=k,
         by_route=True, tiling=tiling)
    return out.view(t, k, x.shape[1])


# A dense SwiGLU MLP (the shared experts, a dense layer) at a few rows: its gate and up projections
# with SiLU(gate) * up in the same launch, as one expert holding every row (32-column blocks, so
# that one expert's weight still spreads over the GPU), in place of cuBLAS's split-K GEMV, its
# reduce and the SwiGLU launch (up to KernelConfig.dense_rows rows).


class DenseRows:
    """The index tensors that make T rows one expert's routes, made once per row count (outside
    graph capture: the capture's warm-up call makes them)."""

    def __init__(self):
        self._by_rows: dict[int, Alignment] = {}

    def __call__(self, rows: int, device: torch.device) -> Alignment:
        al = self._by_rows.get(rows)
        if al is None:
            def ints(*v: int) -> torch.Tensor:
                return torch.tensor(v, dtype=torch.int32, device=device)
            count = ints(rows)
            al = Alignment(torch.arange(rows, dtype=torch.int32, device=device), ints(0), count, ints(0), count, 1)
            self._by_rows[rows] = al
        return al


def dense_swiglu(x: torch.Tensor, gate_up: torch.Tensor, al: Alignment, tiling: Tiling) -> torch.Tensor:
    """x: [T, H]; gate_up: [2I, H] (gate rows, then up rows); al: DenseRows for T; tiling:
    KernelConfig.dense. Returns SiLU(x @ gate.T) * (x @ up.T) [T, I], rounded as F.linear and the
    SwiGLU launch round."""
    two_i, h = gate_up.shape
    i = two_i // 2
    act = torch.empty(x.shape[0], i, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(1, triton.cdiv(i, tiling.up_n))](
        x.contiguous(), gate_up, al.order, al.starts, al.counts, al.active, act, h, i, two_i * h, 1, BY_ROUTE=False,
        BLOCK_M=tiling.block_m, BLOCK_N=tiling.up_n, BLOCK_K=tiling.block_k, num_warps=tiling.num_warps,
        num_stages=tiling.num_stages)
    return act


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, token_index: torch.Tensor,
                  weight: torch.Tensor, counts: torch.Tensor, tiling: Tiling) -> torch.Tensor:
    """A shard's routes, already in expert order (the RoutePlan's execution order).
    x: [T, H]; token_index, weight: [R] per route; counts: [n] routes per owned expert (device);
    tiling: for the step's routes on every rank (ExpertTilings.tiling_for), so a route's bits do
    not depend on the split. Returns [R, H] float32 in the same order."""
    counts = counts.to(torch.int32)
    n = counts.shape[0]
    starts = torch.cumsum(counts, 0, dtype=torch.int32) - counts  # [n]
    r = token_index.shape[0]
    al = Alignment(token_index.to(torch.int32), starts, counts, torch.arange(n, dtype=torch.int32, device=x.device),
                   counts, n)  # every owned expert gets a slot; totals unused here
    out = torch.empty(r, x.shape[1], dtype=torch.float32, device=x.device)
    return _mlp(x.contiguous(), w13, w2, al, n, weight.float().contiguous(), out, topk=1, by_route=False,
                tiling=tiling)
