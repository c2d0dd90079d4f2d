"""The split sampler's (engine/kernels/sample_split.py) last step for a draw row: its tiles' parts
(layout and folds: engine/kernels/sample_plan.py) combined into the token, the log-probs and the
history record, by the program of the row's last launch that finishes last.

Every fold reads the row's tiles in tile order: integer counts and maxima in any order (exact), the
float sums (the pivots' masses, the log-sum-exp) and the exponential race's comparisons one tile
after the other, unrolled (TILES is a constant of the launch), as the one-program kernel
(engine/kernels/sample_row.py) adds and compares its BLOCK_V blocks: with the same tiles, the same
bits (the log-sum-exp too: each tile's exp-sum is taken against the max of the tiles up to it, and
the fold rescales the running sum as that kernel does)."""
from __future__ import annotations

import triton
import triton.language as tl

from pegainfer.engine.kernels.sample_plan import (ALL, F_B2M, F_K2, F_KA, F_M, F_R0K, F_R0X, F_R1K, F_R1X, F_RM, F_RS,
                                                  F_WLN, F_WX, F_WY, I_B2C, I_FIRST, I_IDX2, I_NAN, I_R0C, I_R1C, I_WA,
                                                  I_WIDX, WHOLE, draw_band, kept_after, pick_raw, race_fold)
from pegainfer.engine.kernels.sample_row import row_of
from pegainfer.engine.kernels.sample_select import top_sorted
from pegainfer.engine.kernels.sample_sweeps import BIG, mass


@triton.jit
def final_row(s, logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b, scratch_ptr,
              pf_ptr, pi_ptr, tok_ptr, lp_ptr, ids_ptr, lps_ptr, sweeps_ptr, whole_ptr, mode, c_lo, c_hi, m_hi, k_lim,
              m_all, recount, kept0, N_TOP: tl.constexpr,
              LOGPROBS: tl.constexpr, RECORD: tl.constexpr, COUNT: tl.constexpr, CAP: tl.constexpr,
              TILES: tl.constexpr, TP: tl.constexpr, P: tl.constexpr, NF: tl.constexpr, NI: tl.constexpr):
    """Draw s's token, log-probs, top-N, pass count and history record from its tiles' parts (run by
    the last program of the row's round launch, sample_split._round_kernel), or, for a row the
    passes did not settle, its pass count at whole_ptr[s] (else 0): sample_split._whole_kernel then
    chooses it in one program. mode .. kept0: a top-k / top-p row's sample_plan.plan (defaults for
    the others) and whether the first round's winner is kept, as the round launch found them."""
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
    c_r = tl.full([], 0, tl.int32)
    rounds = filtered & (mode == WHOLE) & recount  # a kept set beyond CAP, raced: the first winner, or the second
    kept1 = tl.full([], 0, tl.int1)
    if filtered:
        passes = tl.where(recount, 4, 3).to(tl.int32)
        if rounds & (kept0 == 0):
            kept1 = kept_after(f_row, i_row, F_B2M, I_B2C, k_lim, top_p, m_all, NF, NI, TILES, TP)
            passes += 1
    if N_TOP > 0:
        r_lo, c_r, r_j = pick_raw(i_row, r_m, N_TOP, NI, TILES, TP, P)
        passes = tl.maximum(passes, 3)
    if plain & (min_p > 0):
        passes = tl.maximum(passes, 2)
    whole = (filtered & (mode == WHOLE) & ((rounds & (kept0 | kept1)) == 0)) | (c_r > CAP)
    # beyond what the fixed passes settle: the row in one program, in the next launch (its passes so far)
    tl.store(whole_ptr + s, tl.where(whole, passes, 0))
    if whole == 0:
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
            if mode == WHOLE:  # the rounds: the race's winner if kept, else the winner among those before it
                w0, w0_x = race_fold(f_row, i_row, F_R0K, F_R0X, I_R0C, NF, NI, TILES, TP)
                w1, w1_x = race_fold(f_row, i_row, F_R1K, F_R1X, I_R1C, NF, NI, TILES, TP)
                token = tl.where(kept0, w0, w1)
            else:  # the sorted candidates' winner (ALL: all of them, draw_sorted's draw; BAND: the band's,
                # against the best of the entries above it, all kept; ties to the column)
                band = mode != ALL
                c_above = tl.where(band, c_hi, 0)
                b_key, b_col = draw_band(s_ptr, c_lo - c_above, c_above, tl.where(band, m_hi, 0.0), inv_t, top, k_lim,
                                         top_p, m_all, state, CAP)
                a_keys = tl.where(band, tl.load(f_row + k * NF + F_KA, mask=k_ok, other=float("-inf")), float("-inf"))
                a_key = tl.max(a_keys, axis=0)
                a_col = tl.min(tl.where(k_ok & (a_keys == a_key), tl.load(i_row + k * NI + I_WA, mask=k_ok, other=BIG),
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
