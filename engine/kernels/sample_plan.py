"""How the split sampler (engine/kernels/sample_split.py) lays out its per-tile parts and reads a
row's back: the parts' offsets, the folds over a row's tiles (counts and maxima in any order, float
sums tile after tile), where a top-k / top-p row's kept set ends (`plan`: the one-program kernel's
pivot choice, then a recount inside its band), the sorted band's draw, and the exact rejection
rounds' per-tile race and their checks (sample_sweeps.race_before, one block at a time)."""
from __future__ import annotations

import triton
import triton.language as tl

from pegainfer.engine.kernels.lowbias import log_noise
from pegainfer.engine.kernels.sample_row import row_of
from pegainfer.engine.kernels.sample_select import sorted_keys
from pegainfer.engine.kernels.sample_sweeps import BIG, deltas, order_key, pick

# float32 parts of a (row, tile), NF = F_MS + 2 * PIVOTS of them: the shaped logits' max; the raw
# logits' max and sum of exp(raw - the max of the tiles up to this one); the plain race's winner
# (x / T, log E, x); the mass of every entry; the min-p race's winner (key, x); the race's best key
# among the entries above a band; the rejection rounds' race winners (key, x: the first among every
# entry, the second among those before the first) and the mass before the first and the second;
# then the mass above each pivot of the first count and of the recount
(F_M, F_RM, F_RS, F_WY, F_WLN, F_WX, F_MALL, F_K2, F_X2, F_KA, F_R0K, F_R0X, F_B1M, F_R1K, F_R1X, F_B2M,
 F_MS) = (tl.constexpr(i) for i in range(17))
# int32 parts, NI = I_CS + 3 * PIVOTS + 1: the first max; the first NaN; the plain race's winner; the
# min-p race's winner; the race's winner above a band; the rounds' winners' columns and the counts
# before them (as the floats); the count of entries; the count above each pivot; the raw logits'
# count; the raw count above each raw pivot; the count above each recount pivot. The count above
# pivot j is at I_CS + j, and j = -1 reads I_CALL (every entry); likewise I_CR + j and I_RALL.
(I_FIRST, I_NAN, I_WIDX, I_IDX2, I_WA, I_R0C, I_B1C, I_R1C, I_B2C, I_CALL, I_CS) = (tl.constexpr(i) for i in range(11))
# modes of a top-k / top-p row after the counts: its candidates gathered whole, a band around the
# boundary gathered (the entries above it all kept, raced where they lie), or the one-program code
ALL, BAND, WHOLE = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
# a row's plan, made once a row by _plan_kernel and read by every program of the later launches:
# floats (the row's max, then plan's lo, hi, m_hi, m_all, top_s, lo1, the top-N's raw floor, the
# first round's winner's x) and ints (plan's mode, c_lo, c_hi, lo_off, hi_off, k_lim, recount, the
# top-N's raw count and pivot, the first round's winner's column); ROW_PARTS of each a row
(R_G, R_LO, R_HI, R_MHI, R_MALL, R_TOPS, R_LO1, R_LOR, R_WX) = (tl.constexpr(i) for i in range(9))
(Q_MODE, Q_CLO, Q_CHI, Q_LOOFF, Q_HIOFF, Q_KLIM, Q_RECOUNT, Q_CR, Q_JR, Q_WCOL) = (tl.constexpr(i) for i in range(10))
ROW_PARTS = tl.constexpr(16)


def layout(pivots: int) -> tuple[int, int]:
    """(NF, NI): the float and int parts per (row, tile)."""
    return 17 + 2 * pivots, 11 + 3 * pivots


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
    more than CAP). Returns (mode, lo, hi, c_lo, c_hi, m_hi, lo_off, hi_off, k_lim, m_all, recount, top_s,
    lo1):
    every entry that can be kept is >= lo (c_lo of them); the entries >= hi (c_hi, mass m_hi) are all
    kept (hi = inf: none); lo_off / hi_off: the int parts holding the tiles' counts at lo / hi (-1:
    none); recount: the first band needs the second count (between lo1, the first count's lo, and
    top_s); then, where the mode is WHOLE, the rejection rounds race among the entries >= lo1."""
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
    lo1 = lo
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
    return mode, lo, hi, c_lo, c_hi, m_hi, lo_off, hi_off, k_lim, m_all, recount, top_s, lo1


@triton.jit
def _plan_kernel(logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b, pf_ptr, pi_ptr,
                 rf_ptr, ri_ptr, N_TOP: tl.constexpr, CAP: tl.constexpr, TILES: tl.constexpr, TP: tl.constexpr,
                 P: tl.constexpr, NF: tl.constexpr, NI: tl.constexpr, RECOUNTED: tl.constexpr):
    # one program a row: its plan from the tiles' parts, written once for the later launches' programs
    # (before, each of a row's programs folded its tiles again: the split sampler's cost at 256 rows)
    s = tl.program_id(0)
    (temp, top_p, min_p, presence, frequency, repetition, top_k, state, has_h, has_b, x_ptr, h_ptr, b_ptr, inv_t,
     filtered, plain) = row_of(s, logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b)
    f_row = pf_ptr + s.to(tl.int64) * (TILES * NF)
    i_row = pi_ptr + s.to(tl.int64) * (TILES * NI)
    rf = rf_ptr + s * ROW_PARTS
    ri = ri_ptr + s * ROW_PARTS
    if filtered:
        g_val = row_max(f_row, NF, F_M, TILES, TP)
        (mode, lo, hi, c_lo, c_hi, m_hi, lo_off, hi_off, k_lim, m_all, recount, top_s,
         lo1) = plan(f_row, i_row, g_val, temp, top_k, top_p, CAP, NF, NI, TILES, TP, P, RECOUNTED)
        tl.store(rf + R_G, g_val)
        tl.store(rf + R_LO, lo)
        tl.store(rf + R_HI, hi)
        tl.store(rf + R_MHI, m_hi)
        tl.store(rf + R_MALL, m_all)
        tl.store(rf + R_TOPS, top_s)
        tl.store(rf + R_LO1, lo1)
        tl.store(ri + Q_MODE, mode)
        tl.store(ri + Q_CLO, c_lo)
        tl.store(ri + Q_CHI, c_hi)
        tl.store(ri + Q_LOOFF, lo_off)
        tl.store(ri + Q_HIOFF, hi_off)
        tl.store(ri + Q_KLIM, k_lim)
        tl.store(ri + Q_RECOUNT, recount.to(tl.int32))
        if RECOUNTED:
            if (mode == WHOLE) & recount:  # the second race's bound: the first round's winner
                w_col, w_x = race_fold(f_row, i_row, F_R0K, F_R0X, I_R0C, NF, NI, TILES, TP)
                tl.store(ri + Q_WCOL, w_col)
                tl.store(rf + R_WX, w_x)
    if RECOUNTED & (N_TOP > 0):
        lo_r, c_r, jr = pick_raw(i_row, row_max(f_row, NF, F_RM, TILES, TP), N_TOP, NI, TILES, TP, P)
        tl.store(rf + R_LOR, lo_r)
        tl.store(ri + Q_CR, c_r)
        tl.store(ri + Q_JR, jr)


@triton.jit
def row_plan(rf_ptr, ri_ptr, s):
    """Row s's plan as _plan_kernel wrote it: plan's (mode, lo, hi, c_lo, c_hi, m_hi, lo_off, hi_off,
    k_lim, m_all, recount, top_s, lo1) and the row's max first."""
    rf = rf_ptr + s * ROW_PARTS
    ri = ri_ptr + s * ROW_PARTS
    return (tl.load(rf + R_G), tl.load(ri + Q_MODE), tl.load(rf + R_LO), tl.load(rf + R_HI), tl.load(ri + Q_CLO),
            tl.load(ri + Q_CHI), tl.load(rf + R_MHI), tl.load(ri + Q_LOOFF), tl.load(ri + Q_HIOFF),
            tl.load(ri + Q_KLIM), tl.load(rf + R_MALL), tl.load(ri + Q_RECOUNT) != 0, tl.load(rf + R_TOPS),
            tl.load(rf + R_LO1))


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
def race_tile(x, cols, ok, inv_t, top, min_p, state, lo, bound):
    """sample_sweeps.race_before over one block: the entries x >= lo (with e > 0 and e >= min_p)
    whose order_key is above bound: (count, mass, the race's best key, its column, its x)."""
    cnt = tl.full([], 0, tl.int32)
    tot = tl.full([], 0.0, tl.float32)
    best = tl.full([], float("-inf"), tl.float32)
    win = tl.full([], BIG, tl.int32)
    win_x = tl.full([], 0.0, tl.float32)
    cand = ok & (x >= lo)
    if tl.max(cand.to(tl.int32), axis=0) > 0:  # blocks wholly below lo draw no noise
        y = x * inv_t - top
        e = tl.exp(y)  # mass(x, inv_t, top)'s bits
        cand = cand & (e > 0) & (e >= min_p) & (order_key(x, cols) > bound)
        cnt = tl.sum(cand.to(tl.int32), axis=0)
        tot = tl.sum(tl.where(cand, e, 0.0), axis=0)
        key = tl.where(cand, y - log_noise(state, cols), float("-inf"))
        best = tl.max(key, axis=0)
        win = tl.min(tl.where(cand & (key == best), cols, BIG), axis=0)
        win_x = pick(x, cols, win)
    return cnt, tot, best, win, win_x


@triton.jit
def race_fold(f_row, i_row, F_K: tl.constexpr, F_X: tl.constexpr, I_C: tl.constexpr, NF: tl.constexpr,
              NI: tl.constexpr, TILES: tl.constexpr, TP: tl.constexpr):
    """The race's winner over a row's tiles from their winners: the best key, ties to the lowest
    column (race_before's fold: a later block only with a larger key): (column, x)."""
    k = tl.arange(0, TP)
    k_ok = k < TILES
    keys = tl.load(f_row + k * NF + F_K, mask=k_ok, other=float("-inf"))
    cols = tl.load(i_row + k * NI + I_C, mask=k_ok, other=BIG)
    best = tl.max(keys, axis=0)
    col = tl.min(tl.where(keys == best, cols, BIG), axis=0)
    x = tl.sum(tl.where(k_ok & (keys == best) & (cols == col), tl.load(f_row + k * NF + F_X, mask=k_ok, other=0.0),
                        0.0), axis=0)
    return col, x


@triton.jit
def kept_after(f_row, i_row, F_B: tl.constexpr, I_B: tl.constexpr, k_lim, top_p, total, NF: tl.constexpr,
               NI: tl.constexpr, TILES: tl.constexpr, TP: tl.constexpr):
    """Whether a round's winner is kept, from the tiles' count and mass of the entries before it
    (the mass summed tile after tile): fewer than k_lim, their share of total below top_p."""
    k = tl.arange(0, TP)
    # .cg: the last launch's tail reads the parts its own launch wrote (past the SM's L1)
    cnt = tl.sum(tl.load(i_row + k * NI + I_B, mask=k < TILES, other=0, cache_modifier=".cg"), axis=0)
    before = tl.full([], 0.0, tl.float32)
    for t in tl.static_range(TILES):
        before += tl.load(f_row + t * NF + F_B, cache_modifier=".cg")
    goal = tl.where(top_p < 1.0, top_p, float("inf"))
    return (cnt == 0) | ((cnt < k_lim) & (tl.math.div_rn(before, total) < goal))
