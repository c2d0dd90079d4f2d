"""Which entries of a row the sampler kernel (engine/kernels/sample.py) keeps, without sorting the
row: the candidates above a threshold, gathered into the program's scratch and sorted there (at
most CAP of them), and the threshold search for kept sets too large to gather.

Sorted candidates (sorted_keys): the order of torch's sort (shaped logit descending; ties by
column ascending, where torch leaves them unspecified). draw_sorted applies top-k (rank < k) and
top-p (the mass before an entry, over the top-k, below top_p of their total: engine/sampler.py's
formula, scan for scan) to them and runs the exponential race among the kept ones; top_sorted
writes the first N as the top-N log-probs.

The count search (threshold) finds where the first k entries of the order end when more than CAP
lie near the boundary (top-k beyond CAP, whose mass top-p then needs; the top-N when many raw
logits tie). A sweep counts, for PIVOTS thresholds t inside the current band [lo, hi), the entries
x >= t and their mass, and the band's count, mass, smallest and largest value. The first sweep's
pivots sit 0.5 to 16 nats below the max; later ones split the band evenly with its largest value
on top, so every sweep narrows the band or drops a value from it. The band ends as one entry, as
one value (ties: the lowest columns count first), or as at most CAP entries, gathered and sorted."""
from __future__ import annotations

import triton
import triton.language as tl

from pegainfer.engine.kernels.lowbias import log_noise
from pegainfer.engine.kernels.sample_sweeps import BIG, LOW31, deltas, gather, mass, pick, shaped

MIN64 = tl.constexpr(-9223372036854775808)  # below every order_key: pads sort last
FINITE = tl.constexpr(3e38)
MAX_SWEEPS = tl.constexpr(48)  # a bound for the graph's sake; the band ends in a few sweeps


@triton.jit
def sorted_keys(ptr, c, CAP: tl.constexpr):
    """The c order keys this program gathered at ptr, sorted descending: (x, cols, ok) [CAP]."""
    tl.debug_barrier()  # the gather's stores came from every thread of the program
    i = tl.arange(0, CAP)
    ok = i < c
    key = tl.sort(tl.load(ptr + i, mask=ok, other=MIN64, cache_modifier=".cg"), descending=True)
    tl.debug_barrier()  # every thread has read before a later gather writes there again
    mono = (key >> 32).to(tl.int32)
    x = (mono ^ ((mono >> 31) & LOW31)).to(tl.float32, bitcast=True)
    return x, ((key & LOW31) ^ LOW31).to(tl.int32), ok


@triton.jit
def draw_sorted(ptr, c, inv_t, top, k_lim, top_p, total, state, CAP: tl.constexpr):
    """The race among the c gathered candidates (every entry top-k and top-p can keep): the first
    k_lim by rank (BIG: no top-k), then those whose mass before them, over those, is below top_p of
    their total (`total`: every entry's mass when top-k cuts nothing)."""
    x, cols, ok = sorted_keys(ptr, c, CAP)
    i = tl.arange(0, CAP)
    kept = ok & (i < k_lim)
    y = x * inv_t - top
    e = tl.where(kept, tl.exp(y), 0.0)
    run = tl.cumsum(e, axis=0)  # [CAP]
    total = tl.where(k_lim < BIG, tl.max(run, axis=0), total)  # the scan's last entry, as torch's
    kept = kept & (tl.math.div_rn(run - e, total) < tl.where(top_p < 1.0, top_p, float("inf")))
    key = tl.where(kept, y - log_noise(state, cols), float("-inf"))
    best = tl.max(key, axis=0)
    return tl.min(tl.where(kept & (key == best), cols, BIG), axis=0)


@triton.jit
def top_sorted(ptr, c, m, log_s, ids_ptr, lps_ptr, N: tl.constexpr, CAP: tl.constexpr):
    """The first N of the c gathered raw logits as log-probs (x - m) - log_s, with their columns."""
    x, cols, ok = sorted_keys(ptr, c, CAP)
    i = tl.arange(0, CAP)
    tl.store(ids_ptr + i, cols.to(tl.int64), mask=i < N)
    tl.store(lps_ptr + i, (x - m) - log_s, mask=i < N)


@triton.jit
def threshold(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency, repetition, V, inv_t, top, min_p,
              top_x, scale, goal, scr, RAW: tl.constexpr, BLOCK_V: tl.constexpr, PIVOTS: tl.constexpr,
              CAP: tl.constexpr):
    """Where the first `goal` entries of the order end: entries with e > 0 and e >= min_p (e = exp(x
    * inv_t - top)), or with RAW every raw logit. top_x: the largest x; scale: the first pivots' unit
    (T, or 1 for raw logits).

    Returns (t_lo, t_hi, r, n, kept, active, sweeps): the first goal are the entries x >= t_hi and,
    of the n in [t_lo, t_hi) (which tie there when r < n), the first r by column; kept: their mass;
    active False: goal is every entry or more (t_lo = t_hi = -inf)."""
    j = tl.arange(0, PIVOTS)
    i = tl.arange(0, CAP)
    lo = tl.full([], float("-inf"), tl.float32)
    hi = tl.full([], float("inf"), tl.float32)
    c_hi = tl.full([], 0, tl.int32)
    m_hi = tl.full([], 0.0, tl.float32)
    a = lo
    b = top_x
    sweeps = tl.full([], 0, tl.int32)
    done = tl.full([], 0, tl.int1)
    active = tl.full([], 1, tl.int1)
    t_lo = lo
    t_hi = lo
    r = tl.full([], 1, tl.int32)
    n = tl.full([], 1, tl.int32)
    kept = tl.full([], 0.0, tl.float32)
    while done == 0:
        if sweeps == 0:
            t = top_x - scale * deltas(j, PIVOTS)
        else:  # even in (a, b], b the band's largest value: every sweep drops a value from the band
            a = tl.clamp(a, -FINITE, FINITE)
            b = tl.clamp(b, -FINITE, FINITE)
            f = (j + 1).to(tl.float32) / PIVOTS
            t = tl.where(j == PIVOTS - 1, b, a * (1.0 - f) + b * f)
        t = tl.minimum(tl.maximum(t, lo), hi)  # [P] ascending
        bc = tl.full([], 0, tl.int32)
        bm = tl.full([], 0.0, tl.float32)
        bmin = tl.full([], float("inf"), tl.float32)
        bmax = tl.full([], float("-inf"), tl.float32)
        pc = tl.zeros([PIVOTS], tl.int32)
        pm = tl.zeros([PIVOTS], tl.float32)
        for c0 in range(0, V, BLOCK_V):
            cols = c0 + tl.arange(0, BLOCK_V)
            ok = cols < V
            raw, x = shaped(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency, repetition, cols, ok)
            if RAW:
                x = raw
            inb = ok & (x >= lo) & (x < hi)
            if tl.max(inb.to(tl.int32), axis=0) > 0:  # most blocks hold no entry of a narrow band
                if RAW:
                    e = tl.zeros([BLOCK_V], tl.float32)
                else:
                    e = mass(x, inv_t, top)
                    inb = inb & (e > 0) & (e >= min_p)
                bc += tl.sum(inb.to(tl.int32), axis=0)
                bm += tl.sum(tl.where(inb, e, 0.0), axis=0)
                bmin = tl.minimum(bmin, tl.min(tl.where(inb, x, float("inf")), axis=0))
                bmax = tl.maximum(bmax, tl.max(tl.where(inb, x, float("-inf")), axis=0))
                for p in tl.static_range(PIVOTS):
                    ge = inb & (x >= pick(t, j, p))
                    pc += tl.where(j == p, tl.sum(ge.to(tl.int32), axis=0), 0)
                    pm += tl.where(j == p, tl.sum(tl.where(ge, e, 0.0), axis=0), 0.0)
        sweeps += 1
        c_lo = c_hi + bc
        sc = c_hi + pc  # [P] entries >= t
        sm = m_hi + pm
        js = tl.max(tl.where(sc >= goal, j, -1), axis=0)  # the highest pivot with goal entries above
        new_lo = tl.where(js >= 0, pick(t, j, js), lo)
        new_clo = tl.where(js >= 0, pick(sc, j, js), c_lo)
        new_mlo = tl.where(js >= 0, pick(sm, j, js), m_hi + bm)
        up = js + 1 < PIVOTS
        new_hi = tl.where(up, pick(t, j, js + 1), hi)
        new_chi = tl.where(up, pick(sc, j, js + 1), c_hi)
        new_mhi = tl.where(up, pick(sm, j, js + 1), m_hi)
        if c_lo < goal:  # first sweep: nothing to cut
            active = tl.full([], 0, tl.int1)
            kept = m_hi + bm
            done = tl.full([], 1, tl.int1)
        elif (bmin == bmax) | (sweeps >= MAX_SWEEPS):  # one value left in the band: ties
            r = (goal - c_hi).to(tl.int32)
            n = bc
            t_lo = bmin
            t_hi = hi
            kept = m_hi + r.to(tl.float32) * mass(bmin, inv_t, top)
            done = tl.full([], 1, tl.int1)
        elif new_clo - new_chi == 1:  # one entry left between two pivots: it is the boundary
            t_lo = new_lo
            t_hi = new_hi
            kept = new_mlo
            done = tl.full([], 1, tl.int1)
        elif new_clo - new_chi <= CAP:  # few enough to sort: gather the band, find the boundary in it
            gather(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency, repetition, V, inv_t, top, min_p,
                   new_lo, new_hi, not RAW, scr, new_lo, new_hi, RAW, scr, CAP, BLOCK_V)
            sweeps += 1
            xs, cs, ok = sorted_keys(scr, new_clo - new_chi, CAP)
            last = goal - 1 - new_chi  # the boundary's place in the band
            v = pick(xs, i, last)
            t_lo = v
            t_hi = tl.min(tl.where(ok & (xs > v), xs, new_hi), axis=0)
            n = tl.sum((ok & (xs == v)).to(tl.int32), axis=0)
            r = tl.sum((ok & (i <= last) & (xs == v)).to(tl.int32), axis=0)
            if RAW:
                kept = new_mhi
            else:
                kept = new_mhi + tl.sum(tl.where(ok & (i <= last), mass(xs, inv_t, top), 0.0), axis=0)
            done = tl.full([], 1, tl.int1)
        else:  # narrow to the band between the pivots around the goal
            a = tl.maximum(bmin, new_lo)
            b = tl.minimum(bmax, new_hi)
            lo = new_lo
            hi = new_hi
            c_hi = new_chi
            m_hi = new_mhi
    return t_lo, t_hi, r, n, kept, active, sweeps
