"""The sweeps over one draw row that the sampler kernel (engine/kernels/sample.py) is made of: the
shaped logits of a block of columns (logit_bias, then the penalties), the threshold search that
turns top-k and top-p into "keep x >= t" without a sort, the exponential-race draw over what is
kept, and the top-N raw log-probs. Each sweep reads the row in BLOCK_V tiles, in column order, in
one program: every sum and every pick has one order per row, whatever else shares the launch.

The kept set of top-k and top-p is a prefix of the row in the order (shaped logit descending, column
ascending); the search finds where the prefix ends. A search sweep counts, for PIVOTS thresholds
t inside the current band [lo, hi), the entries x >= t and their mass (e = exp(x/T - max)), and the
band's own smallest and largest value. The band then narrows to the two pivots around the target
(the k-th entry; the entry at which the mass before it first reaches top_p of the total), until it
holds one entry, or only entries of one value (ties). Ties at the boundary are kept in column order,
the lowest columns first, as many as the target allows. The first sweep's pivots sit 0.5 to 16
nats below the row's max, where the boundaries of top-k, top-p and top-N usually are; the later
ones split the band evenly, and the top one is the band's largest value, so every sweep
resolves the band or drops at least one value from it."""
from __future__ import annotations

import triton
import triton.language as tl

from pegainfer.engine.kernels.lowbias import log_noise

LIMIT = tl.constexpr(1e30)  # engine/sampler.py LOGIT_LIMIT: shaped logits stay within it
SEEN = tl.constexpr(1 << 30)  # history bit: the token is in the prompt
COUNT = tl.constexpr((1 << 30) - 1)  # history bits: how often the token is in the output
BIG = tl.constexpr(2147483647)
FINITE = tl.constexpr(3e38)
MAX_SWEEPS = tl.constexpr(64)  # a bound for the graph's sake: a search needs ~2-5 (see the module doc)


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
def _pick(v, j, at):
    """v[at] of a small tensor v indexed by j."""
    return tl.sum(tl.where(j == at, v, 0), axis=0)


@triton.jit
def threshold(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency, repetition, V, temp, top, min_p,
              top_x, lo, target, base, by_mass, RAW: tl.constexpr, BLOCK_V: tl.constexpr, PIVOTS: tl.constexpr):
    """Where the kept prefix of the row ends, for the target `target * base` of the entries' count
    (by_mass False) or mass (True) at or above the boundary; base < 0: the mass of all entries >= lo,
    measured by the first sweep. The entries are those x >= lo with e > 0 and e >= min_p (e = exp(
    x / temp - top)), or with RAW every raw logit x >= lo (count only). top_x: the row's largest x.

    Returns (t_lo, t_hi, r, n, m_lo, m_hi, e_v, active): the kept entries are those x >= t_hi, and
    of the n entries in [t_lo, t_hi) the first r by column (r < n only when they all tie at t_lo);
    m_lo, m_hi: the mass at or above t_lo, t_hi; e_v: e at t_lo when the band is ties.
    active False: the target is all entries or more (nothing cut; t_lo = t_hi = lo)."""
    j = tl.arange(0, PIVOTS)
    frac = (j + 1).to(tl.float32) / PIVOTS
    if RAW:
        scale = 1.0
    else:
        scale = temp
    hi = float("inf")
    c_hi = 0
    m_hi = 0.0
    a = lo
    b = top_x
    sweeps = 0
    done = False
    active = True
    t_lo = lo
    t_hi = lo
    r = 1
    n = 1
    m_lo = 0.0
    e_v = 0.0
    while not done:
        if sweeps == 0:  # geometric below the max: 16 .. 0.5 nats
            t = top_x - scale * 0.5 * tl.exp2(5.0 * (PIVOTS - 1 - j).to(tl.float32) / (PIVOTS - 1))
        else:  # even in (a, b], the top pivot at b
            a = tl.clamp(a, -FINITE, FINITE)
            b = tl.clamp(b, -FINITE, FINITE)
            t = tl.where(j == PIVOTS - 1, b, a * (1.0 - frac) + b * frac)
        t = tl.minimum(tl.maximum(t, lo), hi)  # [P] ascending
        bc = 0
        bm = 0.0
        bmin = float("inf")
        bmax = float("-inf")
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
                    e = tl.exp(tl.math.div_rn(x, temp) - top)
                    inb = inb & (e > 0) & (e >= min_p)
                bc += tl.sum(inb.to(tl.int32), axis=0)
                bm += tl.sum(tl.where(inb, e, 0.0), axis=0)
                bmin = tl.minimum(bmin, tl.min(tl.where(inb, x, float("inf")), axis=0))
                bmax = tl.maximum(bmax, tl.max(tl.where(inb, x, float("-inf")), axis=0))
                for p in tl.static_range(PIVOTS):
                    ge = inb & (x >= _pick(t, j, p))
                    pc += tl.where(j == p, tl.sum(ge.to(tl.int32), axis=0), 0)
                    pm += tl.where(j == p, tl.sum(tl.where(ge, e, 0.0), axis=0), 0.0)
        c_lo = c_hi + bc
        m_at_lo = m_hi + bm
        if base < 0:
            base = m_at_lo  # the first sweep's band is every entry >= lo
        goal = target * base
        sc = c_hi + pc  # [P] entries >= t
        sm = m_hi + pm
        stat = tl.where(by_mass, sm, sc.to(tl.float32))
        js = tl.max(tl.where(stat >= goal, j, -1), axis=0)  # the highest pivot still reaching the goal
        new_lo = tl.where(js >= 0, _pick(t, j, js), lo)
        new_clo = tl.where(js >= 0, _pick(sc, j, js), c_lo)
        new_mlo = tl.where(js >= 0, _pick(sm, j, js), m_at_lo)
        up = js + 1 < PIVOTS
        new_hi = tl.where(up, _pick(t, j, js + 1), hi)
        new_chi = tl.where(up, _pick(sc, j, js + 1), c_hi)
        new_mhi = tl.where(up, _pick(sm, j, js + 1), m_hi)
        sweeps += 1
        if tl.where(by_mass, m_at_lo, c_lo.to(tl.float32)) < goal:  # first sweep: nothing to cut
            active = False
            done = True
            m_lo = m_at_lo
        elif (bmin == bmax) | (sweeps >= MAX_SWEEPS):  # one value left in the band: ties
            e_v = tl.exp(tl.math.div_rn(bmin, temp) - top)
            need = tl.where(by_mass, tl.math.ceil(tl.math.div_rn(goal - m_hi, e_v)), (goal - c_hi.to(tl.float32)))
            need = tl.where(by_mass & (e_v == 0), bc.to(tl.float32), need)
            r = tl.minimum(tl.maximum(need, 1.0), bc.to(tl.float32)).to(tl.int32)
            n = bc
            t_lo = tl.where(bc > 0, bmin, lo)
            t_hi = hi
            m_lo = m_at_lo
            done = True
        elif new_clo - new_chi == 1:  # one entry left between two pivots: it is the boundary
            t_lo = new_lo
            t_hi = new_hi
            m_lo = new_mlo
            m_hi = new_mhi
            done = True
        else:
            a = tl.maximum(bmin, new_lo)
            b = tl.minimum(bmax, new_hi)
            lo = new_lo
            hi = new_hi
            c_hi = new_chi
            m_hi = new_mhi
    if not active:
        t_lo = lo
        t_hi = lo
    return t_lo, t_hi, r, n, m_lo, m_hi, e_v, active


@triton.jit
def draw(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency, repetition, V, temp, top, min_p, state,
         t_lo, t_hi, r, n, BLOCK_V: tl.constexpr):
    """The exponential race over the kept entries: argmax of (x / temp - top) - log(E) (E = -log(U), U the
    counter uniforms of the row's state), where kept means x >= t_hi, or x in [t_lo, t_hi) among
    the first r in column order (when r < n), with e >= min_p. The first column of equal keys."""
    best = float("-inf")
    pick = -1
    ties = 0
    for c0 in range(0, V, BLOCK_V):
        cols = c0 + tl.arange(0, BLOCK_V)
        ok = cols < V
        raw, x = shaped(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency, repetition, cols, ok)
        cand = ok & (x >= t_lo)
        if tl.max(cand.to(tl.int32), axis=0) > 0:  # blocks wholly below the kept set draw no noise
            xs = tl.math.div_rn(x, temp)
            if min_p > 0:
                e = tl.exp(xs - top)
                cand = cand & (e >= min_p) & (e > 0)
            if r < n:
                band = cand & (x < t_hi)
                rank = ties + tl.cumsum(band.to(tl.int32), axis=0) - 1
                cand = cand & ((x >= t_hi) | (rank < r))
                ties += tl.sum(band.to(tl.int32), axis=0)
            key = tl.where(cand, (xs - top) - log_noise(state, cols), float("-inf"))
            k = tl.max(key, axis=0)
            i = tl.min(tl.where(cand & (key == k), cols, BIG), axis=0)
            better = (k > best) | ((pick < 0) & (i < BIG))
            pick = tl.where(better, i, pick)
            best = tl.where(better, k, best)
    return pick


@triton.jit
def gather_top(x_ptr, V, t_lo, t_hi, r, n, m, log_s, ids_ptr, lps_ptr, N: tl.constexpr, NP: tl.constexpr,
               BLOCK_V: tl.constexpr):
    """The top-N raw log-probs (x - m) - log_s of the entries the RAW threshold kept, written to
    ids_ptr/lps_ptr [N] in torch.topk's order: value descending, ties by column ascending."""
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
