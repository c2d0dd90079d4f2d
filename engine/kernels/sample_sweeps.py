"""The sweeps over one draw row that the sampler kernel (engine/kernels/sample.py) is made of: the
shaped logits of a block of columns (logit_bias, then the penalties), the pivot sweep that counts
the entries above a few thresholds below the row's max, the gather of the entries above a threshold
into the program's scratch (as sort keys), the exponential-race draw over a kept set given as
thresholds, and the top-N writer for a kept set too large to gather. Each sweep reads the row in
BLOCK_V tiles, in column order, in one program: every sum and every pick has one order per row,
whatever else shares the launch.

Entries and their order: the shaped logit x, descending, ties by column ascending; e = exp(x / T -
max) is an entry's unnormalised probability (x / T as x * (1 / T)); the entries a search or a
draw considers are those with e > 0 and e >= min_p (torch zeroes the others)."""
from __future__ import annotations

import triton
import triton.language as tl

from pegainfer.engine.kernels.lowbias import log_noise

LIMIT = tl.constexpr(1e30)  # engine/sampler.py LOGIT_LIMIT: shaped logits stay within it
SEEN = tl.constexpr(1 << 30)  # history bit: the token is in the prompt
COUNT = tl.constexpr((1 << 30) - 1)  # history bits: how often the token is in the output
BIG = tl.constexpr(2147483647)
LOW31 = tl.constexpr(0x7FFFFFFF)


@triton.jit
def _clamp(x):
    return tl.clamp(x, -LIMIT, LIMIT, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def shaped(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency, repetition, cols, ok):
    """(raw, shaped) float32 logits of the columns cols: logit_bias added (b_ptr's dense row), then
    the penalties of the history row h_ptr (int32: count in the output | SEEN), as engine/sampler.py
    computes them, op for op (the launch turns FMA contraction off, so every product rounds)."""
    raw = tl.load(x_ptr + cols, mask=ok, other=float("-inf")).to(tl.float32)
    x = raw
    if has_b:
        x = _clamp(x + tl.load(b_ptr + cols, mask=ok, other=0.0))
    if has_h:
        h = tl.load(h_ptr + cols, mask=ok, other=0)
        count = (h & COUNT).to(tl.float32)
        in_output = count > 0
        scaled = _clamp(tl.where(x > 0, tl.math.div_rn(x, repetition), x * repetition))
        x = tl.where(((h & SEEN) != 0) | in_output, scaled, x)
        x = _clamp(x - frequency * count - presence * in_output.to(tl.float32))
    return raw, x


@triton.jit
def mass(x, inv_t, top):
    """e = exp(x / T - max): one expression, so every sweep computes the same bits."""
    return tl.exp(x * inv_t - top)


@triton.jit
def pick(v, j, at):
    """v[at] of a small tensor v indexed by j."""
    return tl.sum(tl.where(j == at, v, 0), axis=0)


@triton.jit
def order_key(x, cols):
    """int64 keys whose descending order is (x descending, column ascending): x's float bits made
    monotone (negative floats flipped, -0.0 read as +0.0) above the column's complement."""
    bits = (x + 0.0).to(tl.int32, bitcast=True)
    mono = bits ^ ((bits >> 31) & LOW31)
    return (mono.to(tl.int64) << 32) | (cols ^ LOW31).to(tl.int64)


@triton.jit
def deltas(j, PIVOTS: tl.constexpr):
    """The first search's pivots below the max, ascending with j: 16 .. 0.5 nats apart from it, where
    the boundaries of top-k, top-p and the top-N usually are."""
    return 0.5 * tl.exp2(5.0 * (PIVOTS - 1 - j).to(tl.float32) / (PIVOTS - 1))


@triton.jit
def pivot_sweep(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency, repetition, V, inv_t, top, ts, min_p,
                tr, do_s, do_r, BLOCK_V: tl.constexpr, PIVOTS: tl.constexpr):
    """One sweep of counts: with do_s, the entries x >= ts[j] and their mass (cs, ms) and all entries'
    (c_all, m_all); with do_r, the raw logits >= tr[j] (cr). ts, tr: [PIVOTS] ascending."""
    j = tl.arange(0, PIVOTS)
    cs = tl.zeros([PIVOTS], tl.int32)
    ms = tl.zeros([PIVOTS], tl.float32)
    cr = tl.zeros([PIVOTS], tl.int32)
    c_all = 0
    m_all = 0.0
    for c0 in range(0, V, BLOCK_V):
        cols = c0 + tl.arange(0, BLOCK_V)
        ok = cols < V
        raw, x = shaped(x_ptr, h_ptr, b_ptr, has_h & do_s, has_b & do_s, presence, frequency, repetition, cols, ok)
        if do_s:
            e = mass(x, inv_t, top)
            ent = ok & (e > 0) & (e >= min_p)
            c_all += tl.sum(ent.to(tl.int32), axis=0)
            m_all += tl.sum(tl.where(ent, e, 0.0), axis=0)
            for p in tl.static_range(PIVOTS):
                ge = ent & (x >= pick(ts, j, p))
                cs += tl.where(j == p, tl.sum(ge.to(tl.int32), axis=0), 0)
                ms += tl.where(j == p, tl.sum(tl.where(ge, e, 0.0), axis=0), 0.0)
        if do_r:
            for p in tl.static_range(PIVOTS):
                cr += tl.where(j == p, tl.sum((ok & (raw >= pick(tr, j, p))).to(tl.int32), axis=0), 0)
    return cs, ms, c_all, m_all, cr


@triton.jit
def gather(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency, repetition, V, inv_t, top, min_p,
           lo, hi, do_s, s_ptr, lo_r, hi_r, do_r, r_ptr, CAP: tl.constexpr, BLOCK_V: tl.constexpr):
    """One sweep writing order_key of every entry with lo <= x < hi to s_ptr (with do_s) and of every
    raw logit in [lo_r, hi_r) to r_ptr (with do_r), in column order, at most CAP of each."""
    ps = 0
    pr = 0
    for c0 in range(0, V, BLOCK_V):
        cols = c0 + tl.arange(0, BLOCK_V)
        ok = cols < V
        raw, x = shaped(x_ptr, h_ptr, b_ptr, has_h & do_s, has_b & do_s, presence, frequency, repetition, cols, ok)
        if do_s:
            cand = ok & (x >= lo) & (x < hi)
            if tl.max(cand.to(tl.int32), axis=0) > 0:  # most blocks hold none
                e = mass(x, inv_t, top)
                cand = cand & (e > 0) & (e >= min_p)
                pos = ps + tl.cumsum(cand.to(tl.int32), axis=0) - 1
                tl.store(s_ptr + pos, order_key(x, cols), mask=cand & (pos < CAP))
                ps += tl.sum(cand.to(tl.int32), axis=0)
        if do_r:
            cand = ok & (raw >= lo_r) & (raw < hi_r)
            if tl.max(cand.to(tl.int32), axis=0) > 0:
                pos = pr + tl.cumsum(cand.to(tl.int32), axis=0) - 1
                tl.store(r_ptr + pos, order_key(raw, cols), mask=cand & (pos < CAP))
                pr += tl.sum(cand.to(tl.int32), axis=0)


@triton.jit
def race_before(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency, repetition, V, inv_t, top, min_p, state,
                lo, bound, BLOCK_V: tl.constexpr):
    """One sweep over the entries x >= lo whose order_key is above `bound` (those before a given
    entry in the order; MIN64: all of them): their count and mass, and the exponential race's winner
    among them, argmax of (x / T - max) - log(E) (E = -log(U), U the counter uniforms of the row's
    state; the first column of equal keys): (count, mass, column, x)."""
    cnt = tl.full([], 0, tl.int32)
    tot = tl.full([], 0.0, tl.float32)
    best = tl.full([], float("-inf"), tl.float32)
    win = tl.full([], -1, tl.int32)
    win_x = tl.full([], 0.0, tl.float32)
    for c0 in range(0, V, BLOCK_V):
        cols = c0 + tl.arange(0, BLOCK_V)
        ok = cols < V
        raw, x = shaped(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency, repetition, cols, ok)
        cand = ok & (x >= lo)
        if tl.max(cand.to(tl.int32), axis=0) > 0:  # blocks wholly below lo draw no noise
            y = x * inv_t - top
            e = tl.exp(y)  # mass(x, inv_t, top)'s bits
            cand = cand & (e > 0) & (e >= min_p) & (order_key(x, cols) > bound)
            cnt += tl.sum(cand.to(tl.int32), axis=0)
            tot += tl.sum(tl.where(cand, e, 0.0), axis=0)
            key = tl.where(cand, y - log_noise(state, cols), float("-inf"))
            k = tl.max(key, axis=0)
            i = tl.min(tl.where(cand & (key == k), cols, BIG), axis=0)
            better = (k > best) | ((win < 0) & (i < BIG))
            win_x = tl.where(better, pick(x, cols, i), win_x)
            win = tl.where(better, i, win)
            best = tl.where(better, k, best)
    return cnt, tot, win, win_x


@triton.jit
def gather_top(x_ptr, V, t_lo, t_hi, r, n, m, log_s, ids_ptr, lps_ptr, N: tl.constexpr, NP: tl.constexpr,
               BLOCK_V: tl.constexpr):
    """The top-N raw log-probs (x - m) - log_s of the raw logits a threshold keeps (as draw's rule),
    written to ids_ptr/lps_ptr [N] in torch.topk's order: value descending, ties by column."""
    got = 0
    ties = 0
    for c0 in range(0, V, BLOCK_V):
        cols = c0 + tl.arange(0, BLOCK_V)
        ok = cols < V
        x = tl.load(x_ptr + cols, mask=ok, other=float("-inf")).to(tl.float32)
        sel = ok & (x >= t_lo)
        if tl.max(sel.to(tl.int32), axis=0) > 0:
            if r < n:
                band = sel & (x < t_hi)
                rank = ties + tl.cumsum(band.to(tl.int32), axis=0) - 1
                sel = sel & ((x >= t_hi) | (rank < r))
                ties += tl.sum(band.to(tl.int32), axis=0)
            pos = got + tl.cumsum(sel.to(tl.int32), axis=0) - 1
            tl.store(ids_ptr + pos, cols.to(tl.int64), mask=sel & (pos < N))
            tl.store(lps_ptr + pos, x, mask=sel & (pos < N))
            got += tl.sum(sel.to(tl.int32), axis=0)
    tl.debug_barrier()  # the stores above came from every thread of the program
    k = tl.arange(0, NP)
    k_ok = k < N
    ids = tl.load(ids_ptr + k, mask=k_ok, other=BIG, cache_modifier=".cg")
    vals = tl.load(lps_ptr + k, mask=k_ok, other=float("-inf"), cache_modifier=".cg")
    tl.debug_barrier()  # every thread holds its entries before any is overwritten
    before = (vals[None, :] > vals[:, None]) | ((vals[None, :] == vals[:, None]) & (ids[None, :] < ids[:, None]))
    place = tl.sum((before & k_ok[None, :]).to(tl.int32), axis=1)  # [NP] each entry's rank
    tl.store(ids_ptr + place, ids, mask=k_ok)
    tl.store(lps_ptr + place, (vals - m) - log_s, mask=k_ok)
