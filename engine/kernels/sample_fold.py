"""The split sampler's per-tile parts (engine/kernels/sample_split.py) and how a row's are combined:
the layout of the parts, the folds over a row's tiles and the last launch, one program per draw row,
that picks the token from them.

Every fold reads the row's tiles in tile order: integer counts and maxima in any order (exact), the
float sums (the pivots' masses, the log-sum-exp) and the exponential race's comparisons one tile
after the other, unrolled (TILES is a constant of the launch), as the one-program kernel
(engine/kernels/sample_row.py) adds and compares its BLOCK_V blocks: with the same tiles, the same
bits (the log-sum-exp too: each tile's exp-sum is taken against the max of the tiles up to it, and
the fold rescales the running sum as that kernel does)."""
from __future__ import annotations

import triton
import triton.language as tl

from pegainfer.engine.kernels.sample_row import row_of, sample_row
from pegainfer.engine.kernels.lowbias import log_noise
from pegainfer.engine.kernels.sample_select import draw_sorted, sorted_keys, top_sorted
from pegainfer.engine.kernels.sample_sweeps import BIG, deltas, mass, pick

# float32 parts of a (row, tile), NF = F_MS + 2 * PIVOTS of them: the shaped logits' max, the raw
# logits' max and sum of exp(raw - the max of the tiles up to this one), the plain race's winner
# (x / T, log E, x), the mass of every entry, the min-p race's winner (key, x), the race's best key
# among the entries above a band, then the mass above each pivot of the first count and of the recount
F_M, F_RM, F_RS, F_WY, F_WLN, F_WX, F_MALL, F_K2, F_X2, F_KA, F_MS = (tl.constexpr(i) for i in range(11))
# int32 parts, NI = I_CS + 3 * PIVOTS + 2: the first max, the first NaN, the plain race's winner, the
# min-p race's winner, the count of entries, the count above each pivot, the raw logits' count, the
# raw count above each raw pivot, the count above each recount pivot, the race's winner above a band
# (at NI - 1).
# The count above pivot j is at I_CS + j, and j = -1 reads I_CALL (every entry); likewise I_CR + j
# and I_RALL.
I_FIRST, I_NAN, I_WIDX, I_IDX2, I_CALL, I_CS = (tl.constexpr(i) for i in range(6))
# modes of a top-k / top-p row after the counts: its candidates gathered whole, a band around the
# boundary gathered (the entries above it all kept, raced where they lie), or the one-program code
ALL, BAND, WHOLE = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


def layout(pivots: int) -> tuple[int, int]:
    """(NF, NI): the float and int parts per (row, tile)."""
    return 10 + 2 * pivots, 7 + 3 * pivots


@triton.jit
def row_max(f_row, NF: tl.constexpr, FIELD: tl.constexpr, TILES: tl.constexpr, TP: tl.constexpr):
    """The max over a row's tiles of one float part (the tiles' maxima: the row's)."""
    k = tl.arange(0, TP)
    return tl.max(tl.load(f_row + k * NF + FIELD, mask=k < TILES, other=float("-inf")), axis=0)


@triton.jit
def counts(f_row, i_row, I_AT: tl.constexpr, F_AT: tl.constexpr, NF: tl.constexpr, NI: tl.constexpr,
           TILES: tl.constexpr, TP: tl.constexpr, P: tl.constexpr):
    """A row's counts [P] (any order: exact) and masses [P] (tile after tile) above the pivots of one count."""
    j = tl.arange(0, P)
    k = tl.arange(0, TP)
    cs = tl.sum(tl.load(i_row + k[:, None] * NI + I_AT + j[None, :], mask=(k < TILES)[:, None], other=0), axis=0)
    ms = tl.zeros([P], tl.float32)
    for t in tl.static_range(TILES):
        ms += tl.load(f_row + t * NF + F_AT + j)
    return cs, ms


@triton.jit
def plan(f_row, i_row, g_val, temp, top_k, top_p, CAP: tl.constexpr, NF: tl.constexpr, NI: tl.constexpr,
         TILES: tl.constexpr, TP: tl.constexpr, P: tl.constexpr, RECOUNTED: tl.constexpr):
    """Where a top-k / top-p row's kept set ends, from the tiles' counts: the one-program kernel's
    first pivot choice (the highest pivot holding everything top-k / top-p keeps), and, with
    RECOUNTED, the second count's (P pivots evenly inside the first's band, where that band held
    more than CAP). Returns (mode, lo, hi, c_lo, c_hi, m_hi, lo_off, hi_off, k_lim, m_all, recount, top_s):
    every entry that can be kept is >= lo (c_lo of them); the entries >= hi (c_hi, mass m_hi) are all
    kept (hi = inf: none); lo_off / hi_off: the int parts holding the tiles' counts at lo / hi (-1:
    none); recount: the first band needs the second count (between lo and top_s)."""
    j = tl.arange(0, P)
    k = tl.arange(0, TP)
    c_all = tl.sum(tl.load(i_row + k * NI + I_CALL, mask=k < TILES, other=0), axis=0)
    m_all = tl.full([], 0.0, tl.float32)
    for t in tl.static_range(TILES):  # float sums: tile after tile
        m_all += tl.load(f_row + t * NF + F_MALL)
    cs, ms = counts(f_row, i_row, I_CS, F_MS, NF, NI, TILES, TP, P)
    ts = g_val - temp * deltas(j, P)
    k_lim = tl.where((top_k > 0) & (top_k < c_all), top_k, BIG).to(tl.int32)
    goal = tl.where(top_p < 1.0, top_p * m_all, float("inf"))
    holds = tl.where(k_lim < BIG, cs >= k_lim, ms >= goal)
    js = tl.max(tl.where(holds, j, -1), axis=0)
    up = js + 1 < P
    lo = tl.where(js >= 0, pick(ts, j, js), float("-inf"))
    c_lo = tl.where(js >= 0, pick(cs, j, js), c_all)
    lo_off = I_CS + js
    hi = tl.where(up, pick(ts, j, js + 1), float("inf"))
    c_hi = tl.where(up, pick(cs, j, js + 1), 0)
    m_hi = tl.where(up, pick(ms, j, js + 1), 0.0)
    hi_off = tl.where(up, I_CS + js + 1, -1)
    top_s = tl.where(up, hi, g_val)
    # one cut only: with top-k and top-p both, the entries above a band need not all be kept
    one_cut = (k_lim >= BIG) | (top_p >= 1.0)
    recount = (c_lo > CAP) & (c_lo - c_hi > CAP) & (lo > float("-inf")) & one_cut
    if RECOUNTED:
        if recount:
            i_cs2 = I_CS + 2 * P + 1
            cs2, ms2 = counts(f_row, i_row, i_cs2, F_MS + P, NF, NI, TILES, TP, P)
            ts2 = lo + (top_s - lo) * ((j + 1).to(tl.float32) / (P + 1))
            holds2 = tl.where(k_lim < BIG, cs2 >= k_lim, ms2 >= goal)
            js2 = tl.max(tl.where(holds2, j, -1), axis=0)
            up2 = js2 + 1 < P
            lo = tl.where(js2 >= 0, pick(ts2, j, js2), lo)
            c_lo = tl.where(js2 >= 0, pick(cs2, j, js2), c_lo)
            lo_off = tl.where(js2 >= 0, i_cs2 + js2, lo_off)
            hi = tl.where(up2, pick(ts2, j, js2 + 1), hi)
            c_hi = tl.where(up2, pick(cs2, j, js2 + 1), c_hi)
            m_hi = tl.where(up2, pick(ms2, j, js2 + 1), m_hi)
            hi_off = tl.where(up2, i_cs2 + js2 + 1, hi_off)
    mode = tl.where(c_lo <= CAP, ALL, tl.where(one_cut & (c_lo - c_hi <= CAP), BAND, WHOLE))
    return mode, lo, hi, c_lo, c_hi, m_hi, lo_off, hi_off, k_lim, m_all, recount, top_s


@triton.jit
def draw_band(ptr, n, c_hi, m_hi, inv_t, top, k_lim, top_p, total, state, CAP: tl.constexpr):
    """The race's winner (key, column) among the kept entries of a band of n gathered candidates,
    below c_hi entries of mass m_hi: rank c_hi + i < k_lim (total: their mass) or mass before
    m_hi + the band's before them, over total, below top_p (total: every entry's mass)."""
    x, cols, ok = sorted_keys(ptr, n, CAP)
    i = tl.arange(0, CAP)
    kept = ok & (c_hi + i < k_lim)
    y = x * inv_t - top
    e = tl.where(kept, tl.exp(y), 0.0)
    run = m_hi + tl.cumsum(e, axis=0)
    total = tl.where(k_lim < BIG, tl.max(run, axis=0), total)
    kept = kept & (tl.math.div_rn(run - e, total) < tl.where(top_p < 1.0, top_p, float("inf")))
    key = tl.where(kept, y - log_noise(state, cols), float("-inf"))
    best = tl.max(key, axis=0)
    return best, tl.min(tl.where(kept & (key == best), cols, BIG), axis=0)


@triton.jit
def pick_raw(i_row, r_m, N_TOP: tl.constexpr, NI: tl.constexpr, TILES: tl.constexpr, TP: tl.constexpr,
             P: tl.constexpr):
    """The highest raw pivot with N_TOP raw logits above it: (lo_r, c_r, jr)."""
    j = tl.arange(0, P)
    k = tl.arange(0, TP)
    k_ok = k < TILES
    i_cr = I_CS + P + 1
    c_all = tl.sum(tl.load(i_row + k * NI + i_cr - 1, mask=k_ok, other=0), axis=0)
    cr = tl.sum(tl.load(i_row + k[:, None] * NI + i_cr + j[None, :], mask=k_ok[:, None], other=0), axis=0)
    jr = tl.max(tl.where(cr >= N_TOP, j, -1), axis=0)
    lo_r = tl.where(jr >= 0, pick(r_m - deltas(j, P), j, jr), float("-inf"))
    c_r = tl.where(jr >= 0, pick(cr, j, jr), c_all)
    return lo_r, c_r, jr


@triton.jit
def _final_kernel(logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b, scratch_ptr,
                  pf_ptr, pi_ptr, tok_ptr, lp_ptr, ids_ptr, lps_ptr, sweeps_ptr, V, N_TOP: tl.constexpr,
                  NP: tl.constexpr, LOGPROBS: tl.constexpr, RECORD: tl.constexpr, COUNT: tl.constexpr,
                  BLOCK_V: tl.constexpr, ONE_PIVOTS: tl.constexpr, CAP: tl.constexpr, TILES: tl.constexpr,
                  TP: tl.constexpr, P: tl.constexpr, NF: tl.constexpr, NI: tl.constexpr):
    s = tl.program_id(0)
    (temp, top_p, min_p, presence, frequency, repetition, top_k, state, has_h, has_b, x_ptr, h_ptr, b_ptr, inv_t,
     filtered, plain) = row_of(s, logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b)
    f_row = pf_ptr + s.to(tl.int64) * (TILES * NF)
    i_row = pi_ptr + s.to(tl.int64) * (TILES * NI)
    s_ptr = scratch_ptr + s.to(tl.int64) * (2 * CAP)
    k = tl.arange(0, TP)
    k_ok = k < TILES
    # the greedy pick: the first tile holding the row's max, its first column; the first NaN first
    ms = tl.load(f_row + k * NF + F_M, mask=k_ok, other=float("-inf"))
    g_val = tl.max(ms, axis=0)
    first = tl.min(tl.where(k_ok & (ms == g_val), k, TP), axis=0)
    g_idx = tl.sum(tl.where(k == first, tl.load(i_row + k * NI + I_FIRST, mask=k_ok, other=0), 0), axis=0)
    g_nan = tl.min(tl.load(i_row + k * NI + I_NAN, mask=k_ok, other=BIG), axis=0)
    token = tl.where(g_nan < BIG, g_nan, g_idx)
    top = g_val * inv_t
    passes = tl.full([], 1, tl.int32)
    r_m = tl.full([], float("-inf"), tl.float32)
    log_s = tl.full([], 0.0, tl.float32)
    if LOGPROBS:
        r_s = tl.full([], 0.0, tl.float32)
        for t in tl.static_range(TILES):  # sample_row's running sum, block for block
            new = tl.maximum(r_m, tl.load(f_row + t * NF + F_RM))
            r_s = r_s * tl.where(r_m == new, 1.0, tl.exp(r_m - new)) + tl.load(f_row + t * NF + F_RS)
            r_m = new
        log_s = tl.log(r_s)
    mode = ALL
    c_lo = tl.full([], 0, tl.int32)
    c_hi = tl.full([], 0, tl.int32)
    m_hi = tl.full([], 0.0, tl.float32)
    k_lim = tl.full([], BIG, tl.int32)
    m_all = tl.full([], 0.0, tl.float32)
    c_r = tl.full([], 0, tl.int32)
    if filtered:
        mode, _, _, c_lo, c_hi, m_hi, _, _, k_lim, m_all, recount, _ = plan(
            f_row, i_row, g_val, temp, top_k, top_p, CAP, NF, NI, TILES, TP, P, True)
        passes = tl.where(recount, 4, 3).to(tl.int32)
    if N_TOP > 0:
        _, c_r, _ = pick_raw(i_row, r_m, N_TOP, NI, TILES, TP, P)
        passes = tl.maximum(passes, 3)
    if plain & (min_p > 0):
        passes = tl.maximum(passes, 2)
    if (filtered & (mode == WHOLE)) | (c_r > CAP):  # beyond what the fixed passes gather: the row in one program
        sample_row(s, passes, logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b,
                   scratch_ptr, tok_ptr, lp_ptr, ids_ptr, lps_ptr, sweeps_ptr, V, N_TOP, NP, LOGPROBS, RECORD, COUNT,
                   BLOCK_V, ONE_PIVOTS, CAP)
    else:
        if plain:  # the race's winner, tile by tile as the one program compares its blocks
            w_y = tl.full([], 0.0, tl.float32)
            w_ln = tl.full([], 0.0, tl.float32)
            w_x = tl.full([], 0.0, tl.float32)
            w_idx = tl.full([], -1, tl.int32)
            for t in tl.static_range(TILES):
                i_y = tl.load(f_row + t * NF + F_WY)
                i_ln = tl.load(f_row + t * NF + F_WLN)
                won = ((i_y - w_y) - (i_ln - w_ln) > 0) | (w_idx < 0)
                w_x = tl.where(won, tl.load(f_row + t * NF + F_WX), w_x)
                w_idx = tl.where(won, tl.load(i_row + t * NI + I_WIDX), w_idx)
                w_y = tl.where(won, i_y, w_y)
                w_ln = tl.where(won, i_ln, w_ln)
            token = w_idx
            if mass(w_x, inv_t, top) < min_p:  # below min-p's floor: the race among min-p's entries
                best = tl.full([], float("-inf"), tl.float32)
                win = tl.full([], -1, tl.int32)
                for t in tl.static_range(TILES):
                    k2 = tl.load(f_row + t * NF + F_K2)
                    i2 = tl.load(i_row + t * NI + I_IDX2)
                    better = (k2 > best) | ((win < 0) & (i2 < BIG))
                    win = tl.where(better, i2, win)
                    best = tl.where(better, k2, best)
                token = win
        if filtered:
            if mode == ALL:
                token = draw_sorted(s_ptr, c_lo, inv_t, top, k_lim, top_p, m_all, state, CAP)
            else:  # the band's winner against the best of the entries above it (all kept), ties to the column
                b_key, b_col = draw_band(s_ptr, c_lo - c_hi, c_hi, m_hi, inv_t, top, k_lim, top_p, m_all, state, CAP)
                a_keys = tl.load(f_row + k * NF + F_KA, mask=k_ok, other=float("-inf"))
                a_key = tl.max(a_keys, axis=0)
                a_col = tl.min(tl.where(k_ok & (a_keys == a_key), tl.load(i_row + k * NI + NI - 1, mask=k_ok, other=BIG),
                                        BIG), axis=0)
                token = tl.where(a_key > b_key, a_col, tl.where(b_key > a_key, b_col, tl.minimum(a_col, b_col)))
        tl.store(tok_ptr + s, token.to(tl.int64))
        if LOGPROBS:
            tl.store(lp_ptr + s, (tl.load(x_ptr + token).to(tl.float32) - r_m) - log_s)
            if N_TOP > 0:
                top_sorted(s_ptr + CAP, c_r, r_m, log_s, ids_ptr + s * N_TOP, lps_ptr + s * N_TOP, N_TOP, CAP)
        if COUNT:
            tl.store(sweeps_ptr + s, passes)
        if RECORD:
            if has_h:
                tl.store(h_ptr + token, tl.load(h_ptr + token) + 1)
