"""The MoE gate of the decode step, with no atomics and no host sync. First the float32 logits
against the gate weight (few tokens: one program per (token, expert), so the weight streams through
many SMs at once; more: [16 x 16] tiles). Then the selection: the softmax, the DeepSeek-V2 selection
(greedy or group-limited greedy), top-k, optional renormalisation and the routed scaling factor,
each token's k routes written in ascending expert order (the order the fixed-order combine adds
them in). With an Alignment to fill, the routes are also listed by expert for the expert kernels:
each expert's start, count, routes in token-major order and its slot among the experts that have
routes, by one program per expert (up to 16 tokens inside the selection launch, each program
selecting every token; above that, a third launch reading the selected ids). Same semantics as
ep/router.py `route` followed by the per-token sort of ep/plan.py; replaces about a dozen small
kernels per layer."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.moe_experts import Alignment

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
def _logits_tile_kernel(x_ptr, w_ptr, logits_ptr, T, H, E, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
                        BLOCK_H: tl.constexpr):
    """Program (i, j): a [BLOCK_T tokens, BLOCK_E experts] tile of float32 logits (float32 FMAs, no
    tensor-core rounding), so each token's row and each expert's weight are read once per tile."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    acc = tl.zeros([BLOCK_T, BLOCK_E], tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hs = h0 + tl.arange(0, BLOCK_H)
        hm = hs < H
        x = tl.load(x_ptr + t[:, None] * H + hs[None, :], mask=(t[:, None] < T) & hm[None, :], other=0.0)
        w = tl.load(w_ptr + e[None, :] * H + hs[:, None], mask=hm[:, None] & (e[None, :] < E), other=0.0)
        acc = tl.dot(x.to(tl.float32), w, acc, input_precision="ieee")  # [BLOCK_T, BLOCK_E]
    tl.store(logits_ptr + t[:, None] * E + e[None, :], acc, mask=(t[:, None] < T) & (e[None, :] < E))


@triton.jit
def _choose(logits_ptr, t, T, E, scaling, E_PAD: tl.constexpr, TOP_K: tl.constexpr, N_GROUP: tl.constexpr,
            TOPK_GROUP: tl.constexpr, NORM: tl.constexpr):
    """Tokens t ([BLOCK_T]): softmax, selection, top-k, renormalisation and scaling. Returns
    (chosen [BLOCK_T, E_PAD] bool, weight [BLOCK_T, E_PAD] float32 where chosen)."""
    lane = tl.arange(0, E_PAD)
    live = (t[:, None] < T) & (lane[None, :] < E)  # [BLOCK_T, E_PAD]
    logits = tl.load(logits_ptr + t[:, None] * E + lane[None, :], mask=live, other=float("-inf"))
    logits = tl.where(live, logits, float("-inf"))
    p = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    scores = p / tl.sum(p, axis=1)[:, None]  # 0 on padding lanes (NaN on padding rows: never chosen)
    if N_GROUP > 1:
        # group-limited greedy: keep the experts of the TOPK_GROUP groups with the highest best score
        group = lane // (E // N_GROUP)
        gmax = tl.full(scores.shape, float("-inf"), tl.float32)  # lane g < N_GROUP: group g's best score
        for g in tl.static_range(N_GROUP):
            best_g = tl.max(tl.where(live & (group == g)[None, :], scores, float("-inf")), axis=1)
            gmax = tl.where((lane == g)[None, :], best_g[:, None], gmax)
        kept = live & (lane < 0)[None, :]  # all False
        for _ in tl.static_range(TOPK_GROUP):
            g = tl.argmax(gmax, axis=1)
            kept = kept | (group[None, :] == g[:, None])
            gmax = tl.where(lane[None, :] == g[:, None], float("-inf"), gmax)
        scores = tl.where(kept, scores, 0.0)
    s = tl.where(live, scores, -1.0)  # padding is never chosen
    chosen = live & (lane < 0)[None, :]  # all False
    for _ in tl.static_range(TOP_K):
        best = tl.argmax(s, axis=1)  # the first of equal scores
        hit = lane[None, :] == best[:, None]
        chosen = chosen | hit
        s = tl.where(hit, -2.0, s)
    chosen = chosen & live
    w = tl.where(chosen, scores, 0.0)
    if NORM:
        w = w / (tl.sum(w, axis=1)[:, None] + 1e-20)
    return chosen, w * scaling


@triton.jit
def _route_ids(chosen, t, TOP_K: tl.constexpr):
    """Token-major route id of each chosen (token, expert): route j of a token is its j-th chosen
    expert in ascending order."""
    return t[:, None] * TOP_K + tl.cumsum(chosen.to(tl.int32), axis=1) - 1


@triton.jit
def _expert_header(counts, e, E, starts_ptr, counts_ptr, active_ptr, totals_ptr, E_PAD: tl.constexpr):
    """counts: [E_PAD] routes per expert over all tokens. Writes expert e's start, count, totals
    and its slot in the active list (experts with routes ascending, then -1). Returns its start."""
    lane = tl.arange(0, E_PAD)
    mine = tl.sum(tl.where(lane == e, counts, 0), axis=0)
    start = tl.sum(tl.where(lane < e, counts, 0), axis=0)
    tl.store(starts_ptr + e, start)
    tl.store(counts_ptr + e, mine)
    tl.store(totals_ptr + e, tl.load(totals_ptr + e) + mine)
    present = (counts > 0) & (lane < E)
    if mine > 0:
        tl.store(active_ptr + tl.sum(tl.where(present & (lane < e), 1, 0), axis=0), e)
    else:
        n_active = tl.sum(present.to(tl.int32), axis=0)
        tl.store(active_ptr + n_active + tl.sum(tl.where((~present) & (lane < e), 1, 0), axis=0), -1)
    return start


@triton.jit
def _place(chosen, t, e, base, order_ptr, TOP_K: tl.constexpr, E_PAD: tl.constexpr):
    """Expert e's routes among tokens t, token-major (so stable), at order[base...]. Returns how many."""
    lane = tl.arange(0, E_PAD)
    mine = chosen & (lane == e)[None, :]
    col = tl.sum(mine.to(tl.int32), axis=1)  # [BLOCK_T] 1 where the token routes to e
    route = tl.sum(tl.where(mine, _route_ids(chosen, t, TOP_K), 0), axis=1)  # [BLOCK_T]
    tl.store(order_ptr + base + tl.cumsum(col, axis=0) - 1, route, mask=col > 0)
    return tl.sum(col, axis=0)


@triton.jit
def _select_kernel(logits_ptr, weights_ptr, ids_ptr, order_ptr, starts_ptr, counts_ptr, active_ptr, totals_ptr,
                   T, E, scaling, BLOCK_T: tl.constexpr, E_PAD: tl.constexpr, TOP_K: tl.constexpr,
                   N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, NORM: tl.constexpr, ALIGN: tl.constexpr):
    """Without ALIGN, program i selects tokens [i*BLOCK_T, (i+1)*BLOCK_T). With ALIGN (every token
    in one block), program e makes every token's selection (the same arithmetic in each, so the
    same result; program 0 writes it) and lists expert e's routes."""
    lane = tl.arange(0, E_PAD)
    t = (0 if ALIGN else tl.program_id(0) * BLOCK_T) + tl.arange(0, BLOCK_T)
    chosen, w = _choose(logits_ptr, t, T, E, scaling, E_PAD, TOP_K, N_GROUP, TOPK_GROUP, NORM)
    if (not ALIGN) or tl.program_id(0) == 0:
        route = _route_ids(chosen, t, TOP_K)
        tl.store(ids_ptr + route, lane[None, :] + 0 * route, mask=chosen)
        tl.store(weights_ptr + route, w, mask=chosen)
    if ALIGN:
        e = tl.program_id(0)
        start = _expert_header(tl.sum(chosen.to(tl.int32), axis=0), e, E, starts_ptr, counts_ptr, active_ptr,
                               totals_ptr, E_PAD)
        _place(chosen, t, e, start, order_ptr, TOP_K, E_PAD)


@triton.jit
def _chosen_from_ids(ids_ptr, t, T, TOP_K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr):
    """[BLOCK_T, E_PAD] bool: which experts tokens t route to, from their ids."""
    k = tl.arange(0, K_PAD)
    ids = tl.load(ids_ptr + t[:, None] * TOP_K + k[None, :], mask=(t[:, None] < T) & (k[None, :] < TOP_K), other=-1)
    lane = tl.arange(0, E_PAD)
    return tl.sum((ids[:, :, None] == lane[None, None, :]).to(tl.int32), axis=1) > 0


@triton.jit
def _align_kernel(ids_ptr, order_ptr, starts_ptr, counts_ptr, active_ptr, totals_ptr, T, E,
                  BLOCK_T: tl.constexpr, E_PAD: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr):
    """Program e: expert e's routes listed from the selected ids (many tokens: the selection kernel
    then runs one program per token block)."""
    e = tl.program_id(0)
    counts = tl.zeros([E_PAD], tl.int32)
    for t0 in range(0, T, BLOCK_T):
        chosen = _chosen_from_ids(ids_ptr, t0 + tl.arange(0, BLOCK_T), T, TOP_K, K_PAD, E_PAD)
        counts += tl.sum(chosen.to(tl.int32), axis=0)
    base = _expert_header(counts, e, E, starts_ptr, counts_ptr, active_ptr, totals_ptr, E_PAD)
    for t0 in range(0, T, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        base += _place(_chosen_from_ids(ids_ptr, t, T, TOP_K, K_PAD, E_PAD), t, e, base, order_ptr, TOP_K, E_PAD)


SMALL = 16  # up to this many tokens: the one-expert-per-program logits and the one-launch selection


def fused_route(hidden: torch.Tensor, gate_weight: torch.Tensor, *, top_k: int, method: str = "greedy",
                n_group: int | None = None, topk_group: int | None = None, norm_topk_prob: bool = False,
                scaling: float = 1.0, aligned: Alignment | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden: [T, H] (any float dtype); gate_weight: [E, H] float32. Returns (weights [T, k]
    float32, experts [T, k] int32), each token's routes in ascending expert order. aligned:
    buffers (Alignment.empty(T * k, totals)) to also list the routes by expert for the expert
    kernels (engine/kernels/moe_experts.py); totals gets each expert's count added."""
    t, h = hidden.shape
    e = gate_weight.shape[0]
    dev = hidden.device
    x, gw = hidden.contiguous(), gate_weight.contiguous()
    logits = torch.empty(t, e, dtype=torch.float32, device=dev)  # [T, E]
    weights = torch.empty(t, top_k, dtype=torch.float32, device=dev)  # [T, k]
    ids = torch.empty(t, top_k, dtype=torch.int32, device=dev)  # [T, k]
    if t <= SMALL:  # one expert per program, the row in one load: many programs, one round trip each
        _logits_kernel[(t, e)](x, gw, logits, h, e, BLOCK_E=1, BLOCK_H=min(triton.next_power_of_2(h), 2048),
                               num_warps=2)
    else:
        _logits_tile_kernel[(triton.cdiv(t, 16), triton.cdiv(e, 16))](x, gw, logits, t, h, e, BLOCK_T=16,
                                                                      BLOCK_E=16, BLOCK_H=64, num_warps=4)
    grouped = method == "group_limited_greedy"
    al = aligned or Alignment(ids, ids, ids, ids, ids)  # not touched without an alignment to fill
    one_launch = aligned is not None and t <= SMALL
    block_t = triton.next_power_of_2(t) if one_launch else min(SMALL, triton.next_power_of_2(t))
    e_pad = triton.next_power_of_2(e)
    _select_kernel[(e,) if one_launch else (triton.cdiv(t, block_t),)](
        logits, weights, ids, al.order, al.starts, al.counts, al.active, al.totals, t, e, float(scaling),
        BLOCK_T=block_t, E_PAD=e_pad, TOP_K=top_k, N_GROUP=n_group if grouped else 1,
        TOPK_GROUP=topk_group if grouped else 1, NORM=bool(norm_topk_prob and top_k > 1), ALIGN=one_launch,
        num_warps=1 if block_t <= 4 else 2)
    if aligned is not None and not one_launch:
        _align_kernel[(e,)](ids, al.order, al.starts, al.counts, al.active, al.totals, t, e, BLOCK_T=SMALL,
                            E_PAD=e_pad, TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k), num_warps=2)
    return weights, ids
