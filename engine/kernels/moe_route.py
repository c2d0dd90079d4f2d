"""The MoE gate of the decode step, with no host sync. First the float32 logits
against the gate weight (many small programs, so the weight streams through many SMs at once).
Then the selection: the softmax, the DeepSeek-V2 selection (greedy or group-limited greedy),
top-k, optional renormalisation and the routed scaling factor, each token's k routes written in
ascending expert order (the order the fixed-order combine adds them in). With an Alignment to fill, the routes are also listed by expert for the expert kernels:
each expert's count and routes in token-major order at a fixed stride (order[e*T...]), and its
slot among the experts that have routes, by one program per expert (up to 16 tokens inside the
selection launch, each program selecting every token; above that, a third launch reading the
selected ids). Up to 16 tokens with a ticket (Alignment.ticket: the MoE layer hands one where
KernelConfig.router_one_launch) the logits and the selection share one launch: the last logits
program to finish (the one atomic, a ticket) selects and lists (_route_small_kernel). Same semantics
as engine/model/router.py `route` followed by the per-token sort of ep/plan.py; replaces about a
dozen small kernels per layer.

Batch invariance (KernelConfig.batch_invariant, fused_route's `kernels`): a token's logits, routes
and weights are the same bits for any T and either form. Every logits program is the one-launch
form's shape (one expert, ROW_WARPS warps, the row in _row_block_h steps: the same layout, so the
same sum order; without invariance, steps above SMALL tokens take 2-expert programs of 512-wide
blocks), and the selection's two sums (the softmax's, the renormalisation's) are fixed trees over
the expert lanes (_lane_sum), whatever BLOCK_T and warps the selection runs with. Equal scores go
to the lowest expert (tl.argmax), as the reference's stable sort does."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pegainfer.engine.kernels.config import KernelConfig
from pegainfer.engine.kernels.moe_experts import COMPACT_MAX_TOKENS, Alignment
from pegainfer.engine.kernels.ticket import last_to_finish


@triton.jit
def _logits_block(x_ptr, w_ptr, t, j, H, E, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
    """Float32 logits of token t against experts [j*BLOCK_E, (j+1)*BLOCK_E): (experts, logits)."""
    e = j * BLOCK_E + tl.arange(0, BLOCK_E)
    live = e < E
    acc = tl.zeros([BLOCK_E, BLOCK_H], tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hs = h0 + tl.arange(0, BLOCK_H)
        hm = hs < H
        x = tl.load(x_ptr + t * H + hs, mask=hm, other=0.0).to(tl.float32)  # [BLOCK_H]
        w = tl.load(w_ptr + e[:, None] * H + hs[None, :], mask=live[:, None] & hm[None, :], other=0.0)
        acc += w * x[None, :]
    return e, tl.sum(acc, axis=1)


@triton.jit
def _logits_kernel(x_ptr, w_ptr, logits_ptr, H, E, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
    """Program (t, j): float32 logits of token t against experts [j*BLOCK_E, (j+1)*BLOCK_E)."""
    t = tl.program_id(0)
    e, logit = _logits_block(x_ptr, w_ptr, t, tl.program_id(1), H, E, BLOCK_E, BLOCK_H)
    tl.store(logits_ptr + t * E + e, logit, mask=e < E)


@triton.jit
def _lane_sum(x, INVARIANT: tl.constexpr, LOG_E: tl.constexpr):
    """x [BLOCK_T, E_PAD] -> [BLOCK_T], the sum of each row. INVARIANT: a pairwise tree in lane order
    (lanes 2i + 2i+1, then those pairs' sums pairwise, ...; E_PAD = 2**LOG_E), elementwise adds
    whose order no layout changes, so every BLOCK_T and num_warps (each T and each form of the
    router) gives a token the same bits; tl.sum's order follows the tensor's layout."""
    if INVARIANT:
        for _ in tl.static_range(LOG_E):
            pairs = tl.reshape(x, [x.shape[0], x.shape[1] // 2, 2])
            even, odd = tl.split(pairs)
            x = even + odd
        total = tl.reshape(x, [x.shape[0]])
    else:
        total = tl.sum(x, axis=1)
    return total


@triton.jit
def _choose(logits_ptr, t, T, E, scaling, E_PAD: tl.constexpr, TOP_K: tl.constexpr, N_GROUP: tl.constexpr,
            TOPK_GROUP: tl.constexpr, NORM: tl.constexpr, INVARIANT: tl.constexpr, LOG_E: tl.constexpr):
    """Tokens t ([BLOCK_T]): softmax, selection, top-k, renormalisation and scaling. Returns
    (chosen [BLOCK_T, E_PAD] bool, weight [BLOCK_T, E_PAD] float32 where chosen). Maxima and the
    argmax are exact in any order; the two sums are _lane_sum's."""
    lane = tl.arange(0, E_PAD)
    live = (t[:, None] < T) & (lane[None, :] < E)  # [BLOCK_T, E_PAD]
    logits = tl.load(logits_ptr + t[:, None] * E + lane[None, :], mask=live, other=float("-inf"),
                     cache_modifier=".cg")  # other programs of the launch may have written them (one-launch form)
    logits = tl.where(live, logits, float("-inf"))
    p = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    scores = p / _lane_sum(p, INVARIANT, LOG_E)[:, None]  # 0 on padding lanes (NaN on padding rows: never chosen)
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
        w = w / (_lane_sum(w, INVARIANT, LOG_E)[:, None] + 1e-20)
    return chosen, w * scaling


@triton.jit
def _route_ids(chosen, t, TOP_K: tl.constexpr):
    """Token-major route id of each chosen (token, expert): route j of a token is its j-th chosen
    expert in ascending order."""
    return t[:, None] * TOP_K + tl.cumsum(chosen.to(tl.int32), axis=1) - 1


@triton.jit
def _list_expert(col, route, e, T, order_ptr, starts_ptr, counts_ptr, totals_ptr):
    """Expert e's routes: col [T_PAD] 1 where token t routes to e, route [T_PAD] that route's id.
    Listed token-major (so stable) at order[e*T...], a fixed stride, so no expert waits for another's
    count. Returns the count."""
    tl.store(order_ptr + e * T + tl.cumsum(col, axis=0) - 1, route, mask=col > 0)
    mine = tl.sum(col, axis=0)
    tl.store(starts_ptr + e, e * T)
    tl.store(counts_ptr + e, mine)
    tl.store(totals_ptr + e, tl.load(totals_ptr + e) + mine)
    return mine


@triton.jit
def _select_kernel(logits_ptr, weights_ptr, ids_ptr, order_ptr, starts_ptr, counts_ptr, active_ptr, totals_ptr,
                   T, E, scaling, BLOCK_T: tl.constexpr, E_PAD: tl.constexpr, TOP_K: tl.constexpr,
                   N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, NORM: tl.constexpr, ALIGN: tl.constexpr,
                   INVARIANT: tl.constexpr, LOG_E: tl.constexpr):
    """Without ALIGN, program i selects tokens [i*BLOCK_T, (i+1)*BLOCK_T). With ALIGN (every token
    in one block), program e makes every token's selection (the same arithmetic in each, so the
    same result; program 0 writes it), lists expert e's routes and takes e's slot in the active
    list (experts with routes ascending, then -1)."""
    lane = tl.arange(0, E_PAD)
    t = (0 if ALIGN else tl.program_id(0) * BLOCK_T) + tl.arange(0, BLOCK_T)
    chosen, w = _choose(logits_ptr, t, T, E, scaling, E_PAD, TOP_K, N_GROUP, TOPK_GROUP, NORM, INVARIANT, LOG_E)
    route = _route_ids(chosen, t, TOP_K)  # [BLOCK_T, E_PAD]
    if (not ALIGN) or tl.program_id(0) == 0:
        tl.store(ids_ptr + route, lane[None, :] + 0 * route, mask=chosen)
        tl.store(weights_ptr + route, w, mask=chosen)
    if ALIGN:
        e = tl.program_id(0)
        mine = chosen & (lane == e)[None, :]
        n = _list_expert(tl.sum(mine.to(tl.int32), axis=1), tl.sum(tl.where(mine, route, 0), axis=1), e, T,
                         order_ptr, starts_ptr, counts_ptr, totals_ptr)
        present = (tl.sum(chosen.to(tl.int32), axis=0) > 0) & (lane < E)  # [E_PAD]
        if n > 0:
            tl.store(active_ptr + tl.sum(tl.where(present & (lane < e), 1, 0), axis=0), e)
        else:
            n_active = tl.sum(present.to(tl.int32), axis=0)
            tl.store(active_ptr + n_active + tl.sum(tl.where((~present) & (lane < e), 1, 0), axis=0), -1)


@triton.jit
def _route_small_kernel(x_ptr, w_ptr, logits_ptr, weights_ptr, ids_ptr, order_ptr, starts_ptr, counts_ptr,
                        active_ptr, totals_ptr, ticket_ptr, T, E, H, scaling, BLOCK_T: tl.constexpr,
                        E_PAD: tl.constexpr, BLOCK_H: tl.constexpr, TOP_K: tl.constexpr, N_GROUP: tl.constexpr,
                        TOPK_GROUP: tl.constexpr, NORM: tl.constexpr, INVARIANT: tl.constexpr, LOG_E: tl.constexpr):
    """Up to SMALL tokens in one launch: program (t, e) writes token t's logit against expert e, as
    _logits_kernel does; the last program to finish (engine/kernels/ticket.py) makes every token's
    selection and lists every expert's routes, as _select_kernel's programs do between them."""
    t0 = tl.program_id(0)
    e0, logit = _logits_block(x_ptr, w_ptr, t0, tl.program_id(1), H, E, 1, BLOCK_H)
    tl.store(logits_ptr + t0 * E + e0, logit)
    if last_to_finish(ticket_ptr, T * E):
        lane = tl.arange(0, E_PAD)
        t = tl.arange(0, BLOCK_T)
        chosen, w = _choose(logits_ptr, t, T, E, scaling, E_PAD, TOP_K, N_GROUP, TOPK_GROUP, NORM, INVARIANT,
                            LOG_E)
        route = _route_ids(chosen, t, TOP_K)  # [BLOCK_T, E_PAD]
        tl.store(ids_ptr + route, lane[None, :] + 0 * route, mask=chosen)
        tl.store(weights_ptr + route, w, mask=chosen)
        # every expert's routes token-major at order[e*T...], its count, its slot among the active
        col = chosen.to(tl.int32)
        tl.store(order_ptr + lane[None, :] * T + tl.cumsum(col, axis=0) - 1, route, mask=chosen)
        n = tl.sum(col, axis=0)  # [E_PAD]
        e_ok = lane < E
        tl.store(starts_ptr + lane, lane * T, mask=e_ok)
        tl.store(counts_ptr + lane, n, mask=e_ok)
        tl.store(totals_ptr + lane, tl.load(totals_ptr + lane, mask=e_ok, other=0) + n, mask=e_ok)
        present = (n > 0) & e_ok
        absent = (n == 0) & e_ok
        slot = tl.where(present, tl.cumsum(present.to(tl.int32), axis=0) - 1,
                        tl.sum(present.to(tl.int32), axis=0) + tl.cumsum(absent.to(tl.int32), axis=0) - 1)
        tl.store(active_ptr + slot, tl.where(present, lane, -1), mask=e_ok)
        tl.store(ticket_ptr, 0)  # every program has taken its ticket: ready for the next launch


@triton.jit
def _align_kernel(ids_ptr, order_ptr, starts_ptr, counts_ptr, active_ptr, totals_ptr, T,
                  T_PAD: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr):
    """Program e lists expert e's routes from every token's selected ids (read at once). Every
    expert gets its own slot: with more than COMPACT_MAX_TOKENS tokens nearly all have routes."""
    e = tl.program_id(0)
    t = tl.arange(0, T_PAD)
    k = tl.arange(0, K_PAD)
    ok = (t[:, None] < T) & (k[None, :] < TOP_K)
    hit = (tl.load(ids_ptr + t[:, None] * TOP_K + k[None, :], mask=ok, other=-1) == e) & ok  # [T_PAD, K_PAD]
    route = tl.sum(tl.where(hit, t[:, None] * TOP_K + k[None, :], 0), axis=1)  # [T_PAD]
    _list_expert(tl.sum(hit.to(tl.int32), axis=1), route, e, T, order_ptr, starts_ptr, counts_ptr, totals_ptr)
    tl.store(active_ptr + e, e)


SMALL = COMPACT_MAX_TOKENS  # up to this many tokens: one expert per logits program, the one-launch selection
MAX_TOKENS = 1024  # the listing reads every token's ids at once: decode batches, not prompts
ROW_WARPS = 2  # warps of a one-expert logits program (and of the one-launch router)


def _row_block_h(h: int) -> int:
    """The K block of a one-expert logits program: the whole row up to 2048."""
    return min(triton.next_power_of_2(h), 2048)


def fused_route(hidden: torch.Tensor, gate_weight: torch.Tensor, *, top_k: int, method: str = "greedy",
                n_group: int | None = None, topk_group: int | None = None, norm_topk_prob: bool = False,
                scaling: float = 1.0, aligned: Alignment | None = None,
                kernels: KernelConfig = KernelConfig()) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden: [T, H] (any float dtype); gate_weight: [E, H] float32. Returns (weights [T, k]
    float32, experts [T, k] int32), each token's routes in ascending expert order. aligned:
    buffers (Alignment.empty(T, k, totals)) to also list the routes by expert for the expert
    kernels (engine/kernels/moe_experts.py), T <= MAX_TOKENS; totals gets each expert's count added.
    An alignment of up to SMALL tokens that holds a ticket gets the one-launch form.
    kernels.batch_invariant: a token's logits, routes and weights are the same bits for every T and
    either form: every logits program is the one-launch form's (one expert, the row in
    _row_block_h steps, ROW_WARPS warps; above SMALL tokens the faster shape sums in another order
    only without it), and the selection's sums are fixed trees (_lane_sum)."""
    t, h = hidden.shape
    e = gate_weight.shape[0]
    if aligned is not None and t > MAX_TOKENS:
        raise ValueError(f"fused_route lists the routes of up to {MAX_TOKENS} tokens, got {t}")
    dev = hidden.device
    logits = torch.empty(t, e, dtype=torch.float32, device=dev)  # [T, E]
    weights = torch.empty(t, top_k, dtype=torch.float32, device=dev)  # [T, k]
    ids = torch.empty(t, top_k, dtype=torch.int32, device=dev)  # [T, k]
    grouped = method == "group_limited_greedy"
    e_pad = triton.next_power_of_2(e)
    choice = dict(E_PAD=e_pad, TOP_K=top_k, N_GROUP=n_group if grouped else 1, TOPK_GROUP=topk_group if grouped else 1,
                  NORM=bool(norm_topk_prob and top_k > 1), INVARIANT=kernels.batch_invariant,
                  LOG_E=e_pad.bit_length() - 1)
    al = aligned or Alignment(ids, ids, ids, ids, ids, 0)  # not touched without an alignment to fill
    if aligned is not None and aligned.order.shape[0] != e * t:
        raise ValueError(f"the alignment was made for {aligned.order.shape[0] // e} tokens, not {t}")
    one_launch = aligned is not None and aligned.compact  # t <= SMALL
    if one_launch and aligned.ticket is not None:  # logits and selection in one launch
        _route_small_kernel[(t, e)](
            hidden.contiguous(), gate_weight.contiguous(), logits, weights, ids, al.order, al.starts, al.counts,
            al.active, al.totals, aligned.ticket, t, e, h, float(scaling), BLOCK_T=triton.next_power_of_2(t),
            BLOCK_H=_row_block_h(h), num_warps=ROW_WARPS, **choice)
        return weights, ids
    if t <= SMALL or kernels.batch_invariant:  # one expert per program, the row in one load: many programs
        block_e, block_h, warps = 1, _row_block_h(h), ROW_WARPS
    else:
        block_e, block_h, warps = 2, 512, 4
    _logits_kernel[(t, triton.cdiv(e, block_e))](hidden.contiguous(), gate_weight.contiguous(), logits, h, e,
                                                 BLOCK_E=block_e, BLOCK_H=block_h, num_warps=warps)
    block_t = triton.next_power_of_2(t) if one_launch else min(SMALL, triton.next_power_of_2(t))
    _select_kernel[(e,) if one_launch else (triton.cdiv(t, block_t),)](
        logits, weights, ids, al.order, al.starts, al.counts, al.active, al.totals, t, e, float(scaling),
        BLOCK_T=block_t, ALIGN=one_launch, num_warps=1 if block_t <= 4 else 2, **choice)
    if aligned is not None and not one_launch:
        _align_kernel[(e,)](ids, al.order, al.starts, al.counts, al.active, al.totals, t,
                            T_PAD=triton.next_power_of_2(t), TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k),
                            num_warps=4)
    return weights, ids
