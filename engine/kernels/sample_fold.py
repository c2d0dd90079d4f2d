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
from pegainfer.engine.kernels.sample_select import draw_sorted, top_sorted
from pegainfer.engine.kernels.sample_sweeps import BIG, deltas, mass, pick

# float32 parts of a (row, tile), NF = F_MS + PIVOTS of them: the shaped logits' max, the raw
# logits' max and sum of exp(raw - the max of the tiles up to this one), the plain race's winner (x / T, log E, x), the mass of
# every entry, the min-p race's winner (key, x), then the mass above each pivot
F_M, F_RM, F_RS, F_WY, F_WLN, F_WX, F_MALL, F_K2, F_X2, F_MS = (tl.constexpr(i) for i in range(10))
# int32 parts, NI = I_CS + 2 * PIVOTS + 1: the first max, the first NaN, the plain race's winner, the
# min-p race's winner, the count of entries, the count above each pivot, the raw logits' count, the
# raw count above each raw pivot. The count above pivot j is at I_CS + j, and j = -1 reads I_CALL
# (every entry); likewise I_CR + j and I_RALL.
I_FIRST, I_NAN, I_WIDX, I_IDX2, I_CALL, I_CS = (tl.constexpr(i) for i in range(6))


def layout(pivots: int) -> tuple[int, int]:
    """(NF, NI): the float and int parts per (row, tile)."""
    return 9 + pivots, 6 + 2 * pivots


@triton.jit
def row_max(f_row, NF: tl.constexpr, FIELD: tl.constexpr, TILES: tl.constexpr, TP: tl.constexpr):
    """The max over a row's tiles of one float part (the tiles' maxima: the row's)."""
    k = tl.arange(0, TP)
    return tl.max(tl.load(f_row + k * NF + FIELD, mask=k < TILES, other=float("-inf")), axis=0)


@triton.jit
def pick_pivot(f_row, i_row, g_val, temp, top_k, top_p, NF: tl.constexpr, NI: tl.constexpr, TILES: tl.constexpr,
               TP: tl.constexpr, P: tl.constexpr):
    """The one-program kernel's first pivot choice from the tiles' counts: (lo_s, c_s, js, k_lim,
    m_all): every entry top-k and top-p can keep is >= lo_s, c_s of them (js: the pivot, -1 none)."""
    j = tl.arange(0, P)
    k = tl.arange(0, TP)
    k_ok = k < TILES
    c_all = tl.sum(tl.load(i_row + k * NI + I_CALL, mask=k_ok, other=0), axis=0)
    cs = tl.sum(tl.load(i_row + k[:, None] * NI + I_CS + j[None, :], mask=k_ok[:, None], other=0), axis=0)
    m_all = tl.full([], 0.0, tl.float32)
    ms = tl.zeros([P], tl.float32)
    for t in tl.static_range(TILES):  # float sums: tile after tile
        m_all += tl.load(f_row + t * NF + F_MALL)
        ms += tl.load(f_row + t * NF + F_MS + j)
    ts = g_val - temp * deltas(j, P)
    k_lim = tl.where((top_k > 0) & (top_k < c_all), top_k, BIG).to(tl.int32)
    holds = tl.where(k_lim < BIG, cs >= k_lim, ms >= tl.where(top_p < 1.0, top_p * m_all, float("inf")))
    js = tl.max(tl.where(holds, j, -1), axis=0)
    lo_s = tl.where(js >= 0, pick(ts, j, js), float("-inf"))
    c_s = tl.where(js >= 0, pick(cs, j, js), c_all)
    return lo_s, c_s, js, k_lim, m_all


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
    lo_s = tl.full([], float("-inf"), tl.float32)
    c_s = tl.full([], 0, tl.int32)
    k_lim = tl.full([], BIG, tl.int32)
    m_all = tl.full([], 0.0, tl.float32)
    c_r = tl.full([], 0, tl.int32)
    if filtered:
        lo_s, c_s, _, k_lim, m_all = pick_pivot(f_row, i_row, g_val, temp, top_k, top_p, NF, NI, TILES, TP, P)
        passes = tl.full([], 3, tl.int32)
    if N_TOP > 0:
        _, c_r, _ = pick_raw(i_row, r_m, N_TOP, NI, TILES, TP, P)
        passes = tl.full([], 3, tl.int32)
    if plain & (min_p > 0):
        passes = tl.maximum(passes, 2)
    if (filtered & (c_s > CAP)) | (c_r > CAP):  # beyond what the fixed passes gather: the row in one program
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
            token = draw_sorted(s_ptr, c_s, inv_t, top, k_lim, top_p, m_all, state, CAP)
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
