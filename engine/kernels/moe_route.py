"""The MoE gate in one launch: float32 logits against the gate weight (many small programs); the
last program of each token to finish then does the softmax, the DeepSeek-V2 selection (greedy or
group-limited greedy), top-k, optional renormalisation and the routed scaling factor, with each
token's k routes written in ascending expert order (the order the fixed-order combine adds them
in); optionally the last token's program then puts all routes in expert order for the expert
kernels. Same semantics as ep/router.py `route` followed by the per-token sort of ep/plan.py;
replaces about a dozen small kernels per layer in the decode step."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.moe_experts import Alignment, align_routes


@triton.jit
def _route_kernel(x_ptr, w_ptr, logits_ptr, arrivals_ptr, weights_ptr, ids_ptr,
                  order_ptr, starts_ptr, counts_ptr, active_ptr, totals_ptr, T, H, E, scaling,
                  BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, E_PAD: tl.constexpr, TOP_K: tl.constexpr,
                  K_PAD: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, NORM: tl.constexpr,
                  ALIGN: tl.constexpr, R_BLOCK: tl.constexpr):
    """Program (t, j): float32 logits of token t against experts [j*BLOCK_E, (j+1)*BLOCK_E) (many
    small programs, so the gate weight streams through many SMs at once). The last of token t's
    programs to finish (an atomic count in arrivals[t]) selects its routes; with ALIGN, the last
    token to be selected (arrivals[T]) puts every route in expert order. Each counter is put back
    to 0 by the program that saw it full, so the next launch (or graph replay) starts clean."""
    t = tl.program_id(0)
    e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    live = e < E
    acc = tl.zeros([BLOCK_E, BLOCK_H], tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hs = h0 + tl.arange(0, BLOCK_H)
        hm = hs < H
        x = tl.load(x_ptr + t * H + hs, mask=hm, other=0.0).to(tl.float32)  # [BLOCK_H]
        w = tl.load(w_ptr + e[:, None] * H + hs[None, :], mask=live[:, None] & hm[None, :], other=0.0)
        acc += w * x[None, :]
    tl.store(logits_ptr + t * E + e, tl.sum(acc, axis=1), mask=live)
    tl.debug_barrier()  # every thread's stores come before this program's arrival (release below)
    if tl.atomic_add(arrivals_ptr + t, 1, sem="acq_rel") == tl.num_programs(1) - 1:
        tl.store(arrivals_ptr + t, 0)
        _select(logits_ptr, weights_ptr, ids_ptr, t, E, scaling, E_PAD, TOP_K, K_PAD, N_GROUP, TOPK_GROUP, NORM)
        if ALIGN:
            tl.debug_barrier()
            if tl.atomic_add(arrivals_ptr + T, 1, sem="acq_rel") == T - 1:
                tl.store(arrivals_ptr + T, 0)
                align_routes(ids_ptr, order_ptr, starts_ptr, counts_ptr, active_ptr, totals_ptr, T * TOP_K, E,
                             E_PAD, R_BLOCK, True)


@triton.jit
def _select(logits_ptr, weights_ptr, ids_ptr, t, E, scaling, E_PAD: tl.constexpr, TOP_K: tl.constexpr,
            K_PAD: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, NORM: tl.constexpr):
    """Token t's softmax, selection, top-k, renormalisation and scaling, from logits other programs
    wrote (read through L2: they are known to be there from an atomic, not from a kernel boundary)."""
    e = tl.arange(0, E_PAD)
    live = e < E
    logits = tl.load(logits_ptr + t * E + e, mask=live, other=float("-inf"), cache_modifier=".cg")  # [E_PAD]
    logits = tl.where(live, logits, float("-inf"))
    p = tl.exp(logits - tl.max(logits, axis=0))
    scores = p / tl.sum(p, axis=0)  # [E_PAD]; 0 on padding lanes
    if N_GROUP > 1:
        # group-limited greedy: keep the experts of the TOPK_GROUP groups with the highest best score
        group = e // (E // N_GROUP)
        gmax = tl.full([E_PAD], float("-inf"), tl.float32)  # lane g < N_GROUP holds group g's best score
        for g in tl.static_range(N_GROUP):
            best_g = tl.max(tl.where(live & (group == g), scores, float("-inf")), axis=0)
            gmax = tl.where(e == g, best_g, gmax)
        kept = e < 0  # all False
        for _ in tl.static_range(TOPK_GROUP):
            g = tl.argmax(gmax, axis=0)
            kept = kept | (group == g)
            gmax = tl.where(e == g, float("-inf"), gmax)
        scores = tl.where(kept, scores, 0.0)
    k = tl.arange(0, K_PAD)
    sel_w = tl.zeros([K_PAD], tl.float32)
    sel_i = tl.full([K_PAD], E_PAD, tl.int32)
    s = tl.where(live, scores, -1.0)  # padding lanes are never chosen
    for j in tl.static_range(TOP_K):
        best = tl.argmax(s, axis=0)
        sel_w = tl.where(k == j, tl.max(s, axis=0), sel_w)
        sel_i = tl.where(k == j, best.to(tl.int32), sel_i)
        s = tl.where(e == best, -2.0, s)
    valid = k < TOP_K
    if NORM:
        sel_w = sel_w / (tl.sum(tl.where(valid, sel_w, 0.0), axis=0) + 1e-20)
    sel_w = sel_w * scaling
    # ascending expert order within the token: route j goes to the number of smaller ids chosen
    rank = tl.sum(tl.where(valid[None, :] & (sel_i[None, :] < sel_i[:, None]), 1, 0), axis=1)  # [K_PAD]
    tl.store(ids_ptr + t * TOP_K + rank, sel_i, mask=valid)
    tl.store(weights_ptr + t * TOP_K + rank, sel_w, mask=valid)


def fused_route(hidden: torch.Tensor, gate_weight: torch.Tensor, *, top_k: int, method: str = "greedy",
                n_group: int | None = None, topk_group: int | None = None, norm_topk_prob: bool = False,
                scaling: float = 1.0, arrivals: torch.Tensor | None = None,
                aligned: Alignment | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden: [T, H] (any float dtype); gate_weight: [E, H] float32. Returns (weights [T, k]
    float32, experts [T, k] int32), each token's routes in ascending expert order, in one launch.
    arrivals: [>= T+1] int32 zeros the kernel counts in and leaves at zero (the caller keeps one,
    so a CUDA graph replays without a memset); aligned: buffers to also put the routes in expert
    order for the expert kernels (engine/kernels/moe_experts.py)."""
    t, h = hidden.shape
    e = gate_weight.shape[0]
    dev = hidden.device
    if arrivals is None:
        arrivals = torch.zeros(t + 1, dtype=torch.int32, device=dev)
    assert arrivals.numel() >= t + 1 and arrivals.dtype == torch.int32
    logits = torch.empty(t, e, dtype=torch.float32, device=dev)  # [T, E]
    weights = torch.empty(t, top_k, dtype=torch.float32, device=dev)  # [T, k]
    ids = torch.empty(t, top_k, dtype=torch.int32, device=dev)  # [T, k]
    grouped = method == "group_limited_greedy"
    block_e = 1 if t <= 16 else 4  # few tokens: one expert per program, so the weight spreads over more SMs
    al = aligned or Alignment(ids, ids, ids, ids, ids)  # unused without ALIGN
    _route_kernel[(t, triton.cdiv(e, block_e))](
        hidden.contiguous(), gate_weight.contiguous(), logits, arrivals, weights, ids, al.order, al.starts, al.counts,
        al.active, al.totals, t, h, e, float(scaling), BLOCK_E=block_e, BLOCK_H=min(triton.next_power_of_2(h), 2048),
        E_PAD=triton.next_power_of_2(e), TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k),
        N_GROUP=n_group if grouped else 1, TOPK_GROUP=topk_group if grouped else 1,
        NORM=bool(norm_topk_prob and top_k > 1), ALIGN=aligned is not None, R_BLOCK=64, num_warps=4)
    return weights, ids
