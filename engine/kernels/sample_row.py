"""One draw row chosen whole by one program: engine/kernels/sample.py's steps 1-4 (the first sweep,
the pivot counts, the gather and sort, the rejection rounds), as a @triton.jit function. The
one-program kernel (sample.py `_sample_kernel`, KernelConfig.sample.chunks 0) runs it for every row;
the split launches (engine/kernels/sample_split.py) run it for the rows their fixed passes cannot
finish (a kept set or a top-N beyond CAP), so both give those rows the same bits. `row_of` reads a
draw's parameters (SampleRows' columns) for both."""
from __future__ import annotations

import triton
import triton.language as tl

from pegainfer.engine.kernels.argmax import block_best
from pegainfer.engine.kernels.lowbias import log_noise, stream_state
from pegainfer.engine.kernels.sample_select import MIN64, draw_sorted, threshold, top_sorted
from pegainfer.engine.kernels.sample_sweeps import (deltas, gather, gather_top, mass, order_key, pick, pivot_sweep,
                                                   race_before, shaped)

BIG = tl.constexpr(2147483647)
MAX_ROUNDS = tl.constexpr(64)  # a bound for the graph's sake: a round halves the candidates' rank or better


@triton.jit
def row_of(s, logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b):
    """Draw s's parameters and row pointers (SampleRows' columns): (temp, top_p, min_p, presence,
    frequency, repetition, top_k, state, has_h, has_b, x_ptr, h_ptr, b_ptr, inv_t, filtered, plain);
    filtered: top-k or top-p to apply; plain: temperature (and min-p) only."""
    fp = floats_ptr + s * 6
    temp = tl.load(fp)
    top_p = tl.load(fp + 1)
    min_p = tl.load(fp + 2)
    presence = tl.load(fp + 3)
    frequency = tl.load(fp + 4)
    repetition = tl.load(fp + 5)
    ip = ints_ptr + s * 7
    top_k = tl.load(ip)
    state = stream_state(tl.load(ip + 1), tl.load(ip + 2), tl.load(ip + 3))
    h_slot = tl.load(ip + 5)
    b_slot = tl.load(ip + 6)
    has_h = h_slot >= 0
    has_b = b_slot >= 0
    x_ptr = logits_ptr + tl.load(ip + 4) * stride_l
    h_ptr = hist_ptr + tl.maximum(h_slot, 0) * stride_h
    b_ptr = bias_ptr + tl.maximum(b_slot, 0) * stride_b
    hot = temp > 0
    inv_t = tl.math.div_rn(1.0, tl.where(hot, temp, 1.0))
    filtered = hot & ((top_k > 0) | (top_p < 1.0))  # a threshold to find
    plain = hot & (filtered == 0)  # the race runs in the first sweep
    return (temp, top_p, min_p, presence, frequency, repetition, top_k, state, has_h, has_b, x_ptr, h_ptr, b_ptr,
            inv_t, filtered, plain)


@triton.jit
def sample_row(s, base, logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b,
               scratch_ptr, tok_ptr, lp_ptr, ids_ptr, lps_ptr, sweeps_ptr, V, N_TOP: tl.constexpr,
               NP: tl.constexpr, LOGPROBS: tl.constexpr, RECORD: tl.constexpr, COUNT: tl.constexpr,
               BLOCK_V: tl.constexpr, PIVOTS: tl.constexpr, CAP: tl.constexpr):
    """Draw s, whole, in this one program (engine/kernels/sample.py's steps 1-4): its token, log-probs,
    sweep count (base + the sweeps made here) and history record written."""
    (temp, top_p, min_p, presence, frequency, repetition, top_k, state, has_h, has_b, x_ptr, h_ptr, b_ptr, inv_t,
     filtered, plain) = row_of(s, logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b)
    s_ptr = scratch_ptr + s.to(tl.int64) * (2 * CAP)  # [CAP] sort keys of the shaped logits' candidates
    r_ptr = s_ptr + CAP  # [CAP] those of the raw logits'
    # sweep 1: the greedy pick of the shaped logits, the raw log-sum-exp, the plain rows' race
    g_val = tl.full([], float("-inf"), tl.float32)
    g_idx = tl.full([], -1, tl.int32)
    g_nan = tl.full([], BIG, tl.int32)
    r_m = tl.full([], float("-inf"), tl.float32)
    r_s = tl.full([], 0.0, tl.float32)
    w_y = tl.full([], 0.0, tl.float32)
    w_ln = tl.full([], 0.0, tl.float32)
    w_x = tl.full([], 0.0, tl.float32)
    w_idx = tl.full([], -1, tl.int32)
    for c0 in range(0, V, BLOCK_V):
        cols = c0 + tl.arange(0, BLOCK_V)
        ok = cols < V
        raw, x = shaped(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency, repetition, cols, ok)
        m, first, nan = block_best(x, cols, ok)
        better = (m > g_val) | (g_idx < 0)  # a later block only with a larger max: the first index wins
        g_idx = tl.where(better, first, g_idx)
        g_val = tl.where(better, m, g_val)
        g_nan = tl.minimum(g_nan, nan)
        if LOGPROBS:
            new = tl.maximum(r_m, tl.max(raw, axis=0))
            fresh = tl.sum(tl.where(raw > float("-inf"), tl.exp(raw - new), 0.0), axis=0)
            r_s = r_s * tl.where(r_m == new, 1.0, tl.exp(r_m - new)) + fresh
            r_m = new
        if plain:
            # keys relative to the block's max, blocks compared by differences: the noise never
            # vanishes in the rounding of a huge x / T (ties at 1e30 from bias or penalties)
            y = x * inv_t - tl.where(m > float("-inf"), m * inv_t, 0.0)
            ln = log_noise(state, cols)
            key = tl.where(ok, y - ln, float("-inf"))
            k = tl.max(key, axis=0)
            i = tl.min(tl.where(ok & (key == k), cols, BIG), axis=0)
            i_y = pick(x * inv_t, cols, i)
            i_ln = pick(ln, cols, i)
            won = ((i_y - w_y) - (i_ln - w_ln) > 0) | (w_idx < 0)
            w_x = tl.where(won, pick(x, cols, i), w_x)
            w_idx = tl.where(won, i, w_idx)
            w_y = tl.where(won, i_y, w_y)
            w_ln = tl.where(won, i_ln, w_ln)
    token = tl.where(g_nan < BIG, g_nan, g_idx)
    top = g_val * inv_t  # max(x / T): multiplying by 1 / T > 0 keeps the order
    log_s = tl.log(r_s)
    sweeps = tl.full([], 1, tl.int32) + base  # a tensor: the loops below add to it
    redraw = tl.full([], 0, tl.int1)
    if plain:
        token = w_idx
        redraw = mass(w_x, inv_t, top) < min_p  # the winner fell below min-p: race again among the rest
    lo_s = tl.full([], float("-inf"), tl.float32)  # every entry top-k and top-p can keep is >= lo_s
    c_s = tl.full([], BIG, tl.int32)  # how many entries are
    k_lim = tl.full([], BIG, tl.int32)  # top-k, where it cuts
    m_all = tl.full([], 0.0, tl.float32)
    lo_r = tl.full([], float("-inf"), tl.float32)  # the top-N raw logits are >= lo_r
    c_r = tl.full([], BIG, tl.int32)
    want_s = filtered
    want_r = tl.full([], N_TOP > 0, tl.int1)
    if want_s | want_r:
        # sweeps 2..: counts above pivots below the max, the highest pivot that holds all that top-k /
        # top-p can keep (all the top-N) taken; where it holds more than CAP, pivots between it and the
        # next one up, once or twice more
        j = tl.arange(0, PIVOTS)
        ts = g_val - temp * deltas(j, PIVOTS)  # [P] ascending
        tr = r_m - deltas(j, PIVOTS)
        hi_s = g_val
        c_hi_s = tl.full([], 0, tl.int32)
        hi_r = r_m
        c_hi_r = tl.full([], 0, tl.int32)
        passes = 0
        while want_s | want_r:
            cs, ms, c_all, m_pass, cr = pivot_sweep(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency,
                                                    repetition, V, inv_t, top, ts, min_p, tr, want_s, want_r,
                                                    BLOCK_V, PIVOTS)
            sweeps += 1
            passes += 1
            frac = (j + 1).to(tl.float32) / (PIVOTS + 1)
            if want_s:
                m_all = m_pass
                k_lim = tl.where((top_k > 0) & (top_k < c_all), top_k, BIG).to(tl.int32)
                holds = tl.where(k_lim < BIG, cs >= k_lim, ms >= tl.where(top_p < 1.0, top_p * m_all, float("inf")))
                js = tl.max(tl.where(holds, j, -1), axis=0)
                up = js + 1 < PIVOTS
                hi_s = tl.where(up, pick(ts, j, js + 1), hi_s)
                c_hi_s = tl.where(up, pick(cs, j, js + 1), c_hi_s)
                lo_s = tl.where(js >= 0, pick(ts, j, js), lo_s)
                c_s = tl.where(js >= 0, pick(cs, j, js), tl.minimum(c_s, c_all))
                # a recount helps where what can be kept fits: top-k within CAP, fewer than CAP above the next pivot
                fits = (c_hi_s < CAP) & ((k_lim <= CAP) | (k_lim >= BIG))
                want_s = (c_s > CAP) & fits & (lo_s > float("-inf")) & (passes < 3)
                ts = lo_s + (hi_s - lo_s) * frac
            if want_r:
                jr = tl.max(tl.where(cr >= N_TOP, j, -1), axis=0)
                up = jr + 1 < PIVOTS
                hi_r = tl.where(up, pick(tr, j, jr + 1), hi_r)
                c_hi_r = tl.where(up, pick(cr, j, jr + 1), c_hi_r)
                lo_r = tl.where(jr >= 0, pick(tr, j, jr), lo_r)
                c_r = tl.where(jr >= 0, pick(cr, j, jr), tl.minimum(c_r, V))
                want_r = (c_r > CAP) & (lo_r > float("-inf")) & (passes < 3)
                tr = lo_r + (hi_r - lo_r) * frac
    fast_s = filtered & (c_s <= CAP)
    fast_r = tl.full([], 0, tl.int1)
    if N_TOP > 0:
        fast_r = c_r <= CAP
    if fast_s | fast_r:  # then: gather them, sort them, draw
        gather(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency, repetition, V, inv_t, top, min_p,
               lo_s, float("inf"), fast_s, s_ptr, lo_r, float("inf"), fast_r, r_ptr, CAP, BLOCK_V)
        sweeps += 1
        if fast_s:
            token = draw_sorted(s_ptr, c_s, inv_t, top, k_lim, top_p, m_all, state, CAP)
        if fast_r:
            top_sorted(r_ptr, c_r, r_m, log_s, ids_ptr + s * N_TOP, lps_ptr + s * N_TOP, N_TOP, CAP)
    total = m_all  # the mass top-p takes its share of
    if filtered & (fast_s == 0):  # more than CAP candidates: rejection rounds
        redraw = tl.full([], 1, tl.int1)
        if (k_lim < BIG) & (top_p < 1.0):  # top-p's total is the top-k's mass: find where top-k ends
            _, _, _, _, total, _, used = threshold(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency,
                                                  repetition, V, inv_t, top, min_p, g_val, temp, k_lim, s_ptr,
                                                  False, BLOCK_V, PIVOTS, CAP)
            sweeps += used
    if redraw:
        # the race among the entries >= lo_s; while its winner is outside top-k / top-p (counted by the
        # entries before it), the race among those before it (computed in the same sweep): the first
        # winner inside is the race's winner among the kept entries, as argmax over them would be
        goal_m = tl.where(top_p < 1.0, top_p, float("inf"))
        _, _, win, win_x = race_before(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency, repetition, V,
                                       inv_t, top, min_p, state, lo_s, MIN64, BLOCK_V)
        sweeps += 1
        rounds = tl.full([], 0, tl.int32)
        done = (filtered == 0) | ((k_lim >= BIG) & (top_p >= 1.0))  # nothing to check: min-p's were the race
        while done == 0:
            cnt, before, nxt, nxt_x = race_before(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency,
                                                  repetition, V, inv_t, top, min_p, state, lo_s,
                                                  order_key(win_x, win), BLOCK_V)
            sweeps += 1
            rounds += 1
            kept = (cnt == 0) | ((cnt < k_lim) & (tl.math.div_rn(before, total) < goal_m))
            done = kept | (rounds >= MAX_ROUNDS)  # the bound: never reached unless the rounds stop halving
            if done == 0:
                win = nxt
                win_x = nxt_x
        token = win
    tl.store(tok_ptr + s, token.to(tl.int64))

    if LOGPROBS:
        tl.store(lp_ptr + s, (tl.load(x_ptr + token).to(tl.float32) - r_m) - log_s)
        if N_TOP > 0:
            if fast_r == 0:  # more than CAP raw logits near the N-th: count to it, then gather
                n_lo, n_hi, n_r, n_n, _, _, used = threshold(
                    x_ptr, h_ptr, b_ptr, False, False, presence, frequency, repetition, V, 1.0, 0.0, 0.0, r_m, 1.0,
                    tl.full([], N_TOP, tl.int32), r_ptr, True, BLOCK_V, PIVOTS, CAP)
                gather_top(x_ptr, V, n_lo, n_hi, n_r, n_n, r_m, log_s, ids_ptr + s * N_TOP, lps_ptr + s * N_TOP,
                           N_TOP, NP, BLOCK_V)
                sweeps += used + 1
    if COUNT:
        tl.store(sweeps_ptr + s, sweeps)
    if RECORD:
        if has_h:
            tl.store(h_ptr + token, tl.load(h_ptr + token) + 1)

