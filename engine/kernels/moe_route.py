"""The MoE gate of the decode step in two launches. First the float32 logits against the gate weight
(many small programs, so the weight streams through many SMs at once). Then one program per expert
reads every token's logits and makes the same selection each: the softmax, the DeepSeek-V2
selection (greedy or group-limited greedy), top-k, optional renormalisation and the routed scaling
factor, with each token's k routes written in ascending expert order (the order the fixed-order
combine adds them in). With an Alignment to fill, program e also lists its own expert's routes for
the expert kernels: its start, count, routes in token-major order and its slot among the experts
that have routes. Same semantics as ep/router.py `route` followed by the per-token sort of
ep/plan.py; replaces about a dozen small kernels per layer, with no atomics and no host sync."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.moe_experts import Alignment

MAX_TOKENS = 1024  # the selection holds every token's scores in one program: decode batches, not prompts


@triton.jit
def _logits_kernel(x_ptr, w_ptr, logits_ptr, H, E, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
    """Program (t, j): float32 logits of token t against experts [j*BLOCK_E, (j+1)*BLOCK_E)."""
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


@triton.jit
def _select_kernel(logits_ptr, weights_ptr, ids_ptr, order_ptr, starts_ptr, counts_ptr, active_ptr, totals_ptr,
                   T, E, scaling, T_PAD: tl.constexpr, E_PAD: tl.constexpr, TOP_K: tl.constexpr,
                   N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, NORM: tl.constexpr, ALIGN: tl.constexpr):
    """Every program selects every token's routes (the same arithmetic, so the same result); program
    0 writes them, and with ALIGN program e lists expert e's routes."""
    t = tl.arange(0, T_PAD)
    lane = tl.arange(0, E_PAD)
    live = (t[:, None] < T) & (lane[None, :] < E)  # [T_PAD, E_PAD]
    logits = tl.load(logits_ptr + t[:, None] * E + lane[None, :], mask=live, other=float("-inf"))
    logits = tl.where(live, logits, float("-inf"))
    p = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    scores = p / tl.sum(p, axis=1)[:, None]  # [T_PAD, E_PAD]; 0 on padding lanes (NaN on padding rows)
    if N_GROUP > 1:
        # group-limited greedy: keep the experts of the TOPK_GROUP groups with the highest best score
        group = lane // (E // N_GROUP)
        gmax = tl.full([T_PAD, E_PAD], float("-inf"), tl.float32)  # lane g < N_GROUP: group g's best score
        for g in tl.static_range(N_GROUP):
            best_g = tl.max(tl.where(live & (group == g)[None, :], scores, float("-inf")), axis=1)  # [T_PAD]
            gmax = tl.where((lane == g)[None, :], best_g[:, None], gmax)
        kept = live & (lane < 0)[None, :]  # all False
        for _ in tl.static_range(TOPK_GROUP):
            g = tl.argmax(gmax, axis=1)  # [T_PAD]
            kept = kept | (group[None, :] == g[:, None])
            gmax = tl.where(lane[None, :] == g[:, None], float("-inf"), gmax)
        scores = tl.where(kept, scores, 0.0)
    s = tl.where(live, scores, -1.0)  # padding is never chosen
    chosen = live & (lane < 0)[None, :]  # [T_PAD, E_PAD], all False
    for _ in tl.static_range(TOP_K):
        best = tl.argmax(s, axis=1)  # [T_PAD], the first of equal scores
        hit = lane[None, :] == best[:, None]
        chosen = chosen | hit
        s = tl.where(hit, -2.0, s)
    chosen = chosen & live
    w = tl.where(chosen, scores, 0.0)
    if NORM:
        w = w / (tl.sum(w, axis=1)[:, None] + 1e-20)
    w = w * scaling
    rank = tl.cumsum(chosen.to(tl.int32), axis=1) - 1  # route j of token t: its j-th chosen expert, ascending
    route = t[:, None] * TOP_K + rank  # [T_PAD, E_PAD] token-major route id where chosen
    if tl.program_id(0) == 0:
        tl.store(ids_ptr + route, lane[None, :] + 0 * route, mask=chosen)
        tl.store(weights_ptr + route, w, mask=chosen)
    if ALIGN:
        e = tl.program_id(0)
        counts = tl.sum(chosen.to(tl.int32), axis=0)  # [E_PAD] routes per expert
        mine = tl.sum(tl.where(lane == e, counts, 0), axis=0)
        start = tl.sum(tl.where(lane < e, counts, 0), axis=0)
        col = tl.sum(tl.where((lane == e)[None, :] & chosen, 1, 0), axis=1)  # [T_PAD] 1 where token t routes to e
        col_route = tl.sum(tl.where((lane == e)[None, :], route, 0), axis=1)  # [T_PAD]
        pos = start + tl.cumsum(col, axis=0) - 1  # token-major within the expert, so stable
        tl.store(order_ptr + pos, col_route, mask=col > 0)
        tl.store(starts_ptr + e, start)
        tl.store(counts_ptr + e, mine)
        tl.store(totals_ptr + e, tl.load(totals_ptr + e) + mine)
        present = (counts > 0) & (lane < E)
        n_active = tl.sum(present.to(tl.int32), axis=0)
        if mine > 0:  # slot among the experts with routes, ascending; the rest get -1 after them
            slot = tl.sum(tl.where(present & (lane < e), 1, 0), axis=0)
            tl.store(active_ptr + slot, e)
        else:
            slot = n_active + tl.sum(tl.where((~present) & (lane < e), 1, 0), axis=0)
            tl.store(active_ptr + slot, -1)


def fused_route(hidden: torch.Tensor, gate_weight: torch.Tensor, *, top_k: int, method: str = "greedy",
                n_group: int | None = None, topk_group: int | None = None, norm_topk_prob: bool = False,
                scaling: float = 1.0, aligned: Alignment | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden: [T, H] (any float dtype, T <= MAX_TOKENS); gate_weight: [E, H] float32. Returns
    (weights [T, k] float32, experts [T, k] int32), each token's routes in ascending expert order.
    aligned: buffers (Alignment.empty(T * k, totals)) to also list the routes by expert for the
    expert kernels (engine/kernels/moe_experts.py); totals gets each expert's count added."""
    t, h = hidden.shape
    e = gate_weight.shape[0]
    if t > MAX_TOKENS:
        raise ValueError(f"fused_route selects up to {MAX_TOKENS} tokens at once, got {t}")
    dev = hidden.device
    logits = torch.empty(t, e, dtype=torch.float32, device=dev)  # [T, E]
    weights = torch.empty(t, top_k, dtype=torch.float32, device=dev)  # [T, k]
    ids = torch.empty(t, top_k, dtype=torch.int32, device=dev)  # [T, k]
    if t <= 16:  # one expert per program, the row in one load: many programs, each one round trip
        block_e, block_h, warps = 1, min(triton.next_power_of_2(h), 2048), 2
    else:  # fewer programs re-reading each token's row
        block_e, block_h, warps = 8, 256, 4
    _logits_kernel[(t, triton.cdiv(e, block_e))](hidden.contiguous(), gate_weight.contiguous(), logits, h, e,
                                                 BLOCK_E=block_e, BLOCK_H=block_h, num_warps=warps)
    grouped = method == "group_limited_greedy"
    al = aligned or Alignment(ids, ids, ids, ids, ids)  # not touched without ALIGN
    t_pad = triton.next_power_of_2(t)
    _select_kernel[(e if aligned is not None else 1,)](
        logits, weights, ids, al.order, al.starts, al.counts, al.active, al.totals, t, e, float(scaling),
        T_PAD=t_pad, E_PAD=triton.next_power_of_2(e), TOP_K=top_k, N_GROUP=n_group if grouped else 1,
        TOPK_GROUP=topk_group if grouped else 1, NORM=bool(norm_topk_prob and top_k > 1), ALIGN=aligned is not None,
        num_warps=1 if t_pad <= 4 else 4 if t_pad <= 64 else 8)
    return weights, ids
