"""The device sampler with each row split over a fixed number of programs (KernelConfig.sample.chunks):
engine/kernels/sample.py's choice in eight launches, so a batch-1 step reads its row from ~50 SMs
rather than one. A row's vocabulary is cut into BLOCK_V tiles (the one-program kernel's blocks),
program (row, c) takes ceil(tiles / chunks) of them, and every launch writes per-tile parts that
the next reads back (engine/kernels/sample_plan.py: the layout and the folds, tile by tile in tile
order). A launch's programs for rows it has nothing to do for return at once. The two plan launches
(one program a row, sample_plan._plan_kernel) fold a row's parts once into its plan, which the later
launches' programs read, rather than each of the row's ~50 programs folding them again.

1. `_first_kernel`: per tile, the shaped logits' max, first max and first NaN (the greedy pick),
   the raw logits' max, and for temperature-only rows the exponential race's winner (the one
   program's comparison of blocks, replayed in the fold).
2. `_count_kernel` (rows with top-k / top-p, min-p, or log-probs): the row's max from 1's parts,
   then per tile the counts and masses above PIVOTS thresholds below it (the one program's first
   pivot sweep), the raw counts for the top-N, min-p's race among its entries, and the raw exp-sum
   against the max of the tiles up to this one (the one program's running log-sum-exp, block for
   block).
3. `_plan_kernel` (one program a row): the row's max and the first count's plan (sample_plan.plan:
   where the kept set ends, whether its band needs the recount).
4. `_count_kernel` RECOUNT (top-k or top-p alone, where the first count's band around the boundary
   holds more than CAP): counts at PIVOTS thresholds evenly inside that band, and the exponential
   race's winner among every entry above the band's floor (the first rejection round).
5. `_plan_kernel` RECOUNTED: the plan again with the recount's counts, the top-N's raw floor
   (sample_plan.pick_raw) and the first round's winner (sample_plan.race_fold).
6. `_gather_kernel`: from the row's plan, each tile's candidates written as sort keys at the place the tiles before it
   leave (their counts): every entry that can be kept (ALL, the one program's gather, in column
   order), or only the band holding the boundary, with the race's winner among the entries above
   it (all kept: BAND); kept sets larger than that: the count and mass of the entries before the
   first round's winner and the race among them (the second round).
7. `_round_kernel`: where the first round's winner is not kept, the count and mass before the
   second's. Then the row's program that takes the last ticket (engine/kernels/ticket.py: who,
   never an order of sums) picks (sample_fold.final_row): the greedy pick, the race's winner, the
   sort and draw among the gathered candidates (sample_plan.draw_band: all of them, or the band
   against the winner above it), or the first kept round's winner; the log-probs, the top-N, the
   history record.
8. `_whole_kernel` (one program per row): a row none of that settles (both rounds' winners outside,
   top-k and top-p both with a kept set beyond CAP, many ties at the N-th raw logit) chosen whole
   (sample_row.sample_row, the one-program kernel's code); the others return at once. Apart from
   the round launch, so that the heavy one-program code is compiled once, on its own.

How many programs a row gets depends only on the vocabulary and the config, never on the batch, and
no part or fold depends on another row: a row's bits are the same at every batch size. The tokens
are the one-program kernel's wherever both take the same path (same tiles; the gathered sets do
not depend on the pivots, the rounds' races and checks are race_before's, tile for tile); where one
sorts a band and the other runs rounds, the kept sets agree up to the float rounding of a mass at
top-p's boundary (engine/kernels/sample.py's semantics)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pegainfer.engine.kernels.argmax import block_best
from pegainfer.engine.kernels.lowbias import log_noise
from pegainfer.engine.kernels.precompile import launcher
from pegainfer.engine.kernels.sample_fold import final_row
from pegainfer.engine.kernels.sample_plan import (ALL, BAND, F_B1M, F_B2M, F_K2, F_KA, F_M, F_MALL, F_MS, F_R0K, F_R0X,
                                                  F_R1K, F_R1X, F_RM, F_RS, F_WLN, F_WX, F_WY, F_X2, I_B1C, I_B2C,
                                                  I_CALL, I_CS, I_FIRST, I_IDX2, I_NAN, I_R0C, I_R1C, I_WA, I_WIDX,
                                                  Q_CR, Q_JR, Q_WCOL, R_LOR, R_WX, ROW_PARTS, WHOLE, _plan_kernel,
                                                  kept_after, layout, race_fold, race_tile, row_max, row_plan)
from pegainfer.engine.kernels.sample_row import row_of, sample_row
from pegainfer.engine.kernels.sample_select import MIN64
from pegainfer.engine.kernels.ticket import last_to_finish
from pegainfer.engine.kernels.sample_sweeps import BIG, deltas, mass, order_key, pick, shaped


@triton.jit
def _first_kernel(logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b, pf_ptr, pi_ptr,
                  V, LOGPROBS: tl.constexpr, BLOCK_V: tl.constexpr, TILES: tl.constexpr, PER: tl.constexpr,
                  NF: tl.constexpr, NI: tl.constexpr):
    s = tl.program_id(0)
    (temp, top_p, min_p, presence, frequency, repetition, top_k, state, has_h, has_b, x_ptr, h_ptr, b_ptr, inv_t,
     filtered, plain) = row_of(s, logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b)
    t0 = tl.program_id(1) * PER
    for t in range(t0, tl.minimum(t0 + PER, TILES)):
        cols = t * BLOCK_V + tl.arange(0, BLOCK_V)
        ok = cols < V
        f = pf_ptr + (s.to(tl.int64) * TILES + t) * NF
        i = pi_ptr + (s.to(tl.int64) * TILES + t) * NI
        raw, x = shaped(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency, repetition, cols, ok)
        m, first, nan = block_best(x, cols, ok)
        tl.store(f + F_M, m)
        tl.store(i + I_FIRST, first)
        tl.store(i + I_NAN, nan)
        if LOGPROBS:
            tl.store(f + F_RM, tl.max(raw, axis=0))
        if plain:  # sample_row's first sweep, one block
            y = x * inv_t - tl.where(m > float("-inf"), m * inv_t, 0.0)
            ln = log_noise(state, cols)
            key = tl.where(ok, y - ln, float("-inf"))
            k = tl.max(key, axis=0)
            w = tl.min(tl.where(ok & (key == k), cols, BIG), axis=0)
            tl.store(f + F_WY, pick(x * inv_t, cols, w))
            tl.store(f + F_WLN, pick(ln, cols, w))
            tl.store(f + F_WX, pick(x, cols, w))
            tl.store(i + I_WIDX, w)


@triton.jit
def tile_counts(x, ent, e, ts, P: tl.constexpr):
    """One block's entries x >= ts[p] and their mass, [P] each (sample_sweeps.pivot_sweep's sums)."""
    j = tl.arange(0, P)
    cs = tl.zeros([P], tl.int32)
    ms = tl.zeros([P], tl.float32)
    for p in tl.static_range(P):
        ge = ent & (x >= pick(ts, j, p))
        cs += tl.where(j == p, tl.sum(ge.to(tl.int32), axis=0), 0)
        ms += tl.where(j == p, tl.sum(tl.where(ge, e, 0.0), axis=0), 0.0)
    return cs, ms


@triton.jit
def _count_kernel(logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b, pf_ptr, pi_ptr,
                  rf_ptr, ri_ptr, V, N_TOP: tl.constexpr, LOGPROBS: tl.constexpr, RECOUNT: tl.constexpr,
                  CAP: tl.constexpr, BLOCK_V: tl.constexpr, TILES: tl.constexpr, TP: tl.constexpr, PER: tl.constexpr,
                  P: tl.constexpr, NF: tl.constexpr, NI: tl.constexpr):
    s = tl.program_id(0)
    (temp, top_p, min_p, presence, frequency, repetition, top_k, state, has_h, has_b, x_ptr, h_ptr, b_ptr, inv_t,
     filtered, plain) = row_of(s, logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b)
    race = plain & (min_p > 0)
    f_row = pf_ptr + s.to(tl.int64) * (TILES * NF)
    i_row = pi_ptr + s.to(tl.int64) * (TILES * NI)
    t0 = tl.program_id(1) * PER
    j = tl.arange(0, P)
    k = tl.arange(0, TP)
    if RECOUNT:  # the second count, inside the first's band, for the rows whose band held more than CAP
        if filtered:
            (g_val, mode, lo, hi, c_lo, c_hi, m_hi, lo_off, hi_off, k_lim, m_all, recount, top_s,
             lo1) = row_plan(rf_ptr, ri_ptr, s)
            top = g_val * inv_t
            if recount:  # and the rejection rounds' first race, among every entry >= lo
                ts = lo + (top_s - lo) * ((j + 1).to(tl.float32) / (P + 1))
                for t in range(t0, tl.minimum(t0 + PER, TILES)):
                    cols = t * BLOCK_V + tl.arange(0, BLOCK_V)
                    ok = cols < V
                    raw, x = shaped(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency, repetition, cols, ok)
                    e = mass(x, inv_t, top)
                    cs, ms = tile_counts(x, ok & (e > 0) & (e >= min_p), e, ts, P)
                    tl.store(i_row + t * NI + I_CS + 2 * P + 1 + j, cs)
                    tl.store(f_row + t * NF + F_MS + P + j, ms)
                    r_cnt, r_tot, r_key, r_col, r_x = race_tile(x, cols, ok, inv_t, top, min_p, state, lo, MIN64)
                    tl.store(f_row + t * NF + F_R0K, r_key)
                    tl.store(f_row + t * NF + F_R0X, r_x)
                    tl.store(i_row + t * NI + I_R0C, r_col)
    elif filtered | race | LOGPROBS:
        g_val = row_max(f_row, NF, F_M, TILES, TP)
        top = g_val * inv_t
        ts = g_val - temp * deltas(j, P)
        tr = tl.zeros([P], tl.float32)
        if N_TOP > 0:
            tr = row_max(f_row, NF, F_RM, TILES, TP) - deltas(j, P)
        shape = filtered | race
        for t in range(t0, tl.minimum(t0 + PER, TILES)):
            cols = t * BLOCK_V + tl.arange(0, BLOCK_V)
            ok = cols < V
            f = f_row + t * NF
            i = i_row + t * NI
            raw, x = shaped(x_ptr, h_ptr, b_ptr, has_h & shape, has_b & shape, presence, frequency, repetition,
                            cols, ok)
            if LOGPROBS:  # the one program's exp-sum of this block, against the max of the blocks up to it
                new = tl.max(tl.load(f_row + k * NF + F_RM, mask=k <= t, other=float("-inf")), axis=0)
                tl.store(f + F_RS, tl.sum(tl.where(raw > float("-inf"), tl.exp(raw - new), 0.0), axis=0))
            if filtered:  # sample_sweeps.pivot_sweep's counts, one block
                e = mass(x, inv_t, top)
                ent = ok & (e > 0) & (e >= min_p)
                cs, ms = tile_counts(x, ent, e, ts, P)
                tl.store(i + I_CALL, tl.sum(ent.to(tl.int32), axis=0))
                tl.store(f + F_MALL, tl.sum(tl.where(ent, e, 0.0), axis=0))
                tl.store(i + I_CS + j, cs)
                tl.store(f + F_MS + j, ms)
            if N_TOP > 0:
                cr = tl.zeros([P], tl.int32)
                for p in tl.static_range(P):
                    cr += tl.where(j == p, tl.sum((ok & (raw >= pick(tr, j, p))).to(tl.int32), axis=0), 0)
                tl.store(i + I_CS + P, tl.sum((ok & (raw >= float("-inf"))).to(tl.int32), axis=0))
                tl.store(i + I_CS + P + 1 + j, cr)
            if race:  # sample_sweeps.race_before over min-p's entries, one block
                y = x * inv_t - top
                e = tl.exp(y)
                cand = ok & (x >= float("-inf")) & (e > 0) & (e >= min_p)
                key = tl.where(cand, y - log_noise(state, cols), float("-inf"))
                best = tl.max(key, axis=0)
                w = tl.min(tl.where(cand & (key == best), cols, BIG), axis=0)
                tl.store(f + F_K2, best)
                tl.store(f + F_X2, pick(x, cols, w))
                tl.store(i + I_IDX2, w)


@triton.jit
def _gather_kernel(logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b, scratch_ptr,
                   pf_ptr, pi_ptr, rf_ptr, ri_ptr, V, N_TOP: tl.constexpr, CAP: tl.constexpr, BLOCK_V: tl.constexpr,
                   TILES: tl.constexpr, TP: tl.constexpr, PER: tl.constexpr, P: tl.constexpr, NF: tl.constexpr,
                   NI: tl.constexpr):
    s = tl.program_id(0)
    (temp, top_p, min_p, presence, frequency, repetition, top_k, state, has_h, has_b, x_ptr, h_ptr, b_ptr, inv_t,
     filtered, plain) = row_of(s, logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b)
    if filtered | (N_TOP > 0):
        f_row = pf_ptr + s.to(tl.int64) * (TILES * NF)
        i_row = pi_ptr + s.to(tl.int64) * (TILES * NI)
        s_ptr = scratch_ptr + s.to(tl.int64) * (2 * CAP)
        r_ptr = s_ptr + CAP
        t0 = tl.program_id(1) * PER
        k = tl.arange(0, TP)
        before = k < t0  # the row's tiles before this program's: their candidates come first
        mode = tl.full([], WHOLE, tl.int32)
        lo = tl.full([], float("-inf"), tl.float32)
        hi = tl.full([], float("inf"), tl.float32)
        lo1 = lo
        top = tl.full([], 0.0, tl.float32)
        ps = tl.full([], 0, tl.int32)
        rounds = tl.full([], 0, tl.int1)
        bound = tl.full([], 0, tl.int64)
        if filtered:
            (g_val, mode, lo, hi, c_lo, c_hi, m_hi, lo_off, hi_off, k_lim, m_all, recount, top_s,
             lo1) = row_plan(rf_ptr, ri_ptr, s)
            top = g_val * inv_t
            rounds = (mode == WHOLE) & recount
            if rounds:  # the second race: among the entries before the first's winner
                bound = order_key(tl.load(rf_ptr + s * ROW_PARTS + R_WX), tl.load(ri_ptr + s * ROW_PARTS + Q_WCOL))
            ps = tl.sum(tl.load(i_row + k * NI + lo_off, mask=before, other=0), axis=0)
            if mode == BAND:  # the band only: less the tiles' entries above it
                above = tl.sum(tl.load(i_row + k * NI + tl.maximum(hi_off, 0), mask=before, other=0), axis=0)
                ps -= tl.where(hi_off >= 0, above, 0)
        fast_s = filtered & (mode != WHOLE)
        band = fast_s & (mode == BAND)
        hi_g = tl.where(band, hi, float("inf"))
        lo_r = tl.full([], float("-inf"), tl.float32)
        c_r = tl.full([], BIG, tl.int32)
        pr = tl.full([], 0, tl.int32)
        if N_TOP > 0:
            lo_r = tl.load(rf_ptr + s * ROW_PARTS + R_LOR)
            c_r = tl.load(ri_ptr + s * ROW_PARTS + Q_CR)
            jr = tl.load(ri_ptr + s * ROW_PARTS + Q_JR)
            pr = tl.sum(tl.load(i_row + k * NI + I_CS + P + 1 + jr, mask=before, other=0), axis=0)
        fast_r = c_r <= CAP
        if fast_s | fast_r | rounds:
            for t in range(t0, tl.minimum(t0 + PER, TILES)):  # sample_sweeps.gather, these blocks
                cols = t * BLOCK_V + tl.arange(0, BLOCK_V)
                ok = cols < V
                shape = fast_s | rounds
                raw, x = shaped(x_ptr, h_ptr, b_ptr, has_h & shape, has_b & shape, presence, frequency, repetition,
                                cols, ok)
                if rounds:
                    cnt, tot, r_key, r_col, r_x = race_tile(x, cols, ok, inv_t, top, min_p, state, lo1, bound)
                    tl.store(i_row + t * NI + I_B1C, cnt)
                    tl.store(f_row + t * NF + F_B1M, tot)
                    tl.store(f_row + t * NF + F_R1K, r_key)
                    tl.store(f_row + t * NF + F_R1X, r_x)
                    tl.store(i_row + t * NI + I_R1C, r_col)
                if fast_s:
                    cand = ok & (x >= lo) & (x < hi_g)
                    if tl.max(cand.to(tl.int32), axis=0) > 0:
                        e = mass(x, inv_t, top)
                        cand = cand & (e > 0) & (e >= min_p)
                        pos = ps + tl.cumsum(cand.to(tl.int32), axis=0) - 1
                        tl.store(s_ptr + pos, order_key(x, cols), mask=cand & (pos < CAP))
                        ps += tl.sum(cand.to(tl.int32), axis=0)
                    if band:  # the race among the entries above the band (every one kept), this block's winner
                        above = ok & (x >= hi)
                        a_key = tl.full([], float("-inf"), tl.float32)
                        a_col = tl.full([], BIG, tl.int32)
                        if tl.max(above.to(tl.int32), axis=0) > 0:
                            y = x * inv_t - top
                            e = tl.exp(y)  # mass(x, inv_t, top)'s bits
                            above = above & (e > 0) & (e >= min_p)
                            key = tl.where(above, y - log_noise(state, cols), float("-inf"))
                            a_key = tl.max(key, axis=0)
                            a_col = tl.min(tl.where(above & (key == a_key), cols, BIG), axis=0)
                        tl.store(f_row + t * NF + F_KA, a_key)
                        tl.store(i_row + t * NI + I_WA, a_col)
                if fast_r:  # every raw logit the counts counted (no upper bound: +inf counts as well)
                    cand = ok & (raw >= lo_r)
                    if tl.max(cand.to(tl.int32), axis=0) > 0:
                        pos = pr + tl.cumsum(cand.to(tl.int32), axis=0) - 1
                        tl.store(r_ptr + pos, order_key(raw, cols), mask=cand & (pos < CAP))
                        pr += tl.sum(cand.to(tl.int32), axis=0)


@triton.jit
def _round_kernel(logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b, scratch_ptr,
                  pf_ptr, pi_ptr, rf_ptr, ri_ptr, tok_ptr, lp_ptr, ids_ptr, lps_ptr, sweeps_ptr, whole_ptr, ticket_ptr,
                  V, N_TOP: tl.constexpr, LOGPROBS: tl.constexpr, RECORD: tl.constexpr, COUNT: tl.constexpr,
                  CAP: tl.constexpr, BLOCK_V: tl.constexpr, TILES: tl.constexpr, TP: tl.constexpr, PER: tl.constexpr,
                  P: tl.constexpr, NF: tl.constexpr, NI: tl.constexpr):
    # the rejection rounds' second check: where the first winner is not kept, the count and mass of
    # the entries before the second; then the row's last program to finish picks (sample_fold.final_row)
    s = tl.program_id(0)
    (temp, top_p, min_p, presence, frequency, repetition, top_k, state, has_h, has_b, x_ptr, h_ptr, b_ptr, inv_t,
     filtered, plain) = row_of(s, logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b)
    f_row = pf_ptr + s.to(tl.int64) * (TILES * NF)
    i_row = pi_ptr + s.to(tl.int64) * (TILES * NI)
    # the plan of a top-k / top-p row (_plan_kernel's), read here and handed to the pick
    mode = tl.full([], ALL, tl.int32)
    c_lo = tl.full([], 0, tl.int32)
    c_hi = tl.full([], 0, tl.int32)
    m_hi = tl.full([], 0.0, tl.float32)
    k_lim = tl.full([], BIG, tl.int32)
    m_all = tl.full([], 0.0, tl.float32)
    recount = tl.full([], 0, tl.int1)
    kept0 = tl.full([], 0, tl.int1)
    if filtered:
        (g_val, mode, lo, hi, c_lo, c_hi, m_hi, lo_off, hi_off, k_lim, m_all, recount, top_s,
         lo1) = row_plan(rf_ptr, ri_ptr, s)
        top = g_val * inv_t
        if (mode == WHOLE) & recount:
            kept0 = kept_after(f_row, i_row, F_B1M, I_B1C, k_lim, top_p, m_all, NF, NI, TILES, TP)
            if kept0 == 0:
                w_col, w_x = race_fold(f_row, i_row, F_R1K, F_R1X, I_R1C, NF, NI, TILES, TP)
                bound = order_key(w_x, w_col)
                t0 = tl.program_id(1) * PER
                for t in range(t0, tl.minimum(t0 + PER, TILES)):
                    cols = t * BLOCK_V + tl.arange(0, BLOCK_V)
                    ok = cols < V
                    raw, x = shaped(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency, repetition, cols, ok)
                    cnt, tot, r_key, r_col, r_x = race_tile(x, cols, ok, inv_t, top, min_p, state, lo1, bound)
                    tl.store(i_row + t * NI + I_B2C, cnt)
                    tl.store(f_row + t * NF + F_B2M, tot)
    if last_to_finish(ticket_ptr + s, tl.num_programs(1)):  # decides who picks, never an order of sums
        final_row(s, logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b, scratch_ptr,
                  pf_ptr, pi_ptr, tok_ptr, lp_ptr, ids_ptr, lps_ptr, sweeps_ptr, whole_ptr, mode, c_lo, c_hi, m_hi,
                  k_lim, m_all, recount, kept0, N_TOP, LOGPROBS, RECORD, COUNT, CAP, TILES, TP, P, NF, NI)
        tl.store(ticket_ptr + s, 0)  # every program has taken its ticket: ready for the next launch


@triton.jit
def _whole_kernel(logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b, scratch_ptr,
                  tok_ptr, lp_ptr, ids_ptr, lps_ptr, sweeps_ptr, whole_ptr, V, N_TOP: tl.constexpr, NP: tl.constexpr,
                  LOGPROBS: tl.constexpr, RECORD: tl.constexpr, COUNT: tl.constexpr, BLOCK_V: tl.constexpr,
                  PIVOTS: tl.constexpr, CAP: tl.constexpr):
    # the rows the split's passes did not settle, each whole in one program (the one-program kernel's code)
    s = tl.program_id(0)
    passes = tl.load(whole_ptr + s)
    if passes > 0:
        sample_row(s, passes, logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b,
                   scratch_ptr, tok_ptr, lp_ptr, ids_ptr, lps_ptr, sweeps_ptr, V, N_TOP, NP, LOGPROBS, RECORD, COUNT,
                   BLOCK_V, PIVOTS, CAP)


def programs_per_row(vocab: int, block_v: int, chunks: int) -> tuple[int, int, int]:
    """(tiles, tiles per program, programs per row) of a vocabulary: a function of the vocabulary and
    the config only, never of the batch."""
    tiles = triton.cdiv(vocab, block_v)
    per = triton.cdiv(tiles, max(1, min(chunks, tiles)))
    return tiles, per, triton.cdiv(tiles, per)


def launch(logits: torch.Tensor, rows, history: torch.Tensor, bias: torch.Tensor, scratch: torch.Tensor, *,
           outs: tuple[torch.Tensor, ...], tickets: torch.Tensor, n_top: int, logprobs: bool, record: bool,
           count: bool, chunks: int, block_v: int, pivots: int, one_pivots: int, cap: int, num_warps: int,
           warm: list | None = None) -> None:
    """The eight launches for rows.floats.shape[0] draws (sample.sample's arguments, checked there).
    outs: (tokens, chosen log-probs, top ids, top log-probs, sweeps) as the one-program kernel takes
    them; tickets: [>= S] int32 zeros (engine/kernels/ticket.py), left at zero. warm: a list to record
    the launches into instead of running them (engine/kernels/precompile.py)."""
    s, v = rows.floats.shape[0], logits.shape[1]
    tiles, per, programs = programs_per_row(v, block_v, chunks)
    nf, ni = layout(pivots)
    pf = torch.empty(s * tiles * nf, dtype=torch.float32, device=logits.device)  # [S, tiles, NF] parts
    pi = torch.empty(s * tiles * ni, dtype=torch.int32, device=logits.device)  # [S, tiles, NI]
    row = (logits, logits.stride(0), rows.floats, rows.ints, history, history.stride(0), bias, bias.stride(0))
    shape = {"BLOCK_V": block_v, "TILES": tiles, "PER": per, "NF": nf, "NI": ni}
    tp = triton.next_power_of_2(tiles)
    opts = {"num_warps": num_warps, "enable_fp_fusion": False}
    rf = torch.empty(s * ROW_PARTS.value, dtype=torch.float32, device=logits.device)  # [S, ROW_PARTS] plans
    ri = torch.empty(s * ROW_PARTS.value, dtype=torch.int32, device=logits.device)
    go = {k: launcher(k, (s, programs), warm) for k in (_first_kernel, _count_kernel, _gather_kernel, _round_kernel)}
    go[_first_kernel](*row, pf, pi, v, LOGPROBS=logprobs, **shape, **opts)
    folds = {"N_TOP": n_top, "CAP": cap, "TILES": tiles, "TP": tp, "P": pivots, "NF": nf, "NI": ni}
    for recount in (False, True):
        go[_count_kernel](*row, pf, pi, rf, ri, v, N_TOP=n_top, LOGPROBS=logprobs, RECOUNT=recount, CAP=cap, TP=tp,
                          P=pivots, **shape, **opts)
        launcher(_plan_kernel, (s,), warm)(*row, pf, pi, rf, ri, RECOUNTED=recount, **folds, **opts)
    go[_gather_kernel](*row, scratch, pf, pi, rf, ri, v, N_TOP=n_top, CAP=cap, TP=tp, P=pivots, **shape, **opts)
    whole = torch.empty(s, dtype=torch.int32, device=logits.device)  # [S] passes of the rows left to _whole_kernel
    flags = {"N_TOP": n_top, "LOGPROBS": logprobs, "RECORD": record, "COUNT": count, "CAP": cap}
    go[_round_kernel](*row, scratch, pf, pi, rf, ri, *outs, whole, tickets, v, TP=tp, P=pivots, **flags, **shape,
                      **opts)
    launcher(_whole_kernel, (s,), warm)(*row, scratch, *outs, whole, v, NP=triton.next_power_of_2(max(n_top, 1)),
                                        BLOCK_V=block_v, PIVOTS=one_pivots, **flags, **opts)
