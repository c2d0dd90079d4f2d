"""The whole token choice of a step in one launch, one program per draw row: logit_bias, the
penalties, the greedy pick, temperature, min-p, top-k, top-p, the seeded exponential-race draw,
the chosen token's raw log-prob and the top-N raw log-probs, with engine/sampler.py's semantics and
order of operations, without sorting the row: it is swept in BLOCK_V tiles a few times
(engine/kernels/sample_sweeps.py, sample_select.py). A row's result reads only that row and its own
parameters, in a fixed order: the same bits at every batch size and position (batch-invariant by
construction). Every per-row parameter is a device tensor and no shape depends on the data, so the
launch can be captured in a CUDA graph.

How a row is chosen, and how often it is read (`sweeps`):
1. every row: the shaped logits' max and first argmax (the greedy token), the raw log-sum-exp when
   log-probs are asked for, and for temperature-only rows the race itself. Greedy and temperature
   rows stop here (temperature with min-p races again among min-p's entries in the rare case its
   winner fell below the floor: 2).
2. top-k / top-p rows (and the top-N): count the entries above PIVOTS thresholds 0.5 to 16 nats
   below the max, and their mass; take the highest threshold above which lie all the entries top-k
   and top-p can keep (the top-N). Where that holds more than CAP entries, count again at pivots
   between it and the next threshold up (at most twice).
3. gather those entries (at most CAP) into the program's scratch as sort keys, sort them there,
   apply top-k and top-p to the sorted list as torch does (rank < k; the mass before, over the
   top-k's total, below top_p) and race among the kept ones: 3 sweeps in all, 4 with a recount.
4. kept sets beyond CAP (a flat distribution's nucleus, top-k above CAP): exact rejection rounds.
   The race's winner among all entries that can be kept is the token if it is kept (counted by the
   entries before it in the order: fewer than k, and their mass below top_p of the total); if not,
   every kept entry comes before it, and the next candidate is the winner among those, found in the
   same sweep. With top-k and top-p both, a count search (sample_select.threshold) first finds the
   top-k's mass. A few rounds: each accepts with about the kept share of the candidates' mass.

Semantics against engine.sampler.sample (tests/engine/kernels/test_sample.py checks them):
- bias and penalties: the same float32 ops in the same order (FMA contraction is off), so the
  shaped logits and the greedy token are bit-identical; torch.argmax's first-of-equal-maxima rule
  (and its first NaN). A row without a bias or history slot is left untouched, where torch clamps
  every row of a batch that has any: they differ only for a raw logit beyond +-1e30 (infinite).
- draw: argmax((x / T - max) - log E) rather than argmax(softmax(x / T) / E), x / T as x * (1 / T):
  equal in law and in exact arithmetic; the roundings pick differently only where two keys agree
  to ~1e-7 relative. E is engine.counter_rng's noise, bit for bit (engine/kernels/lowbias.py).
- min-p keeps e >= min_p with e = exp(x / T - max), torch keeps p >= min_p * max(p); top-k and
  top-p order by the shaped logit, ties by column ascending, torch by the probability after its
  sort, ties in an unspecified order; top-p's total is summed in another order. So the kept sets
  are the same unless an entry's probability or mass-before sits within float rounding (~1e-6
  relative) of a boundary, or equal logits straddle it: then this kernel keeps the tied entries of
  lowest column, as many as top-k / top-p allow, where torch keeps those its sort put first.
- log-probs are x - max - log(sum(exp(x - max))) of the raw logits (torch's log_softmax within
  ~1e-6), the top-N in torch.topk's order with ties by column ascending.

Per-request state the decode graph keeps on the device: `history` [slots, V] int32, a token's count
in the output plus HISTORY_SEEN when it is in the prompt (the penalties' input; with record=True the
launch adds 1 at the chosen token of every row that has a slot), and `bias` [slots, V] float32, the
request's dense logit_bias row; SampleRows names each draw's slot (-1: none)."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from pegainfer.engine.kernels.argmax import block_best
from pegainfer.engine.kernels.lowbias import log_noise, stream_state
from pegainfer.engine.kernels.sample_select import MIN64, draw_sorted, threshold, top_sorted
from pegainfer.engine.kernels.sample_sweeps import (deltas, gather, gather_top, mass, order_key, pick, pivot_sweep,
                                                   race_before, shaped)

FLOATS = ("temperature", "top_p", "min_p", "presence", "frequency", "repetition")  # SampleRows.floats columns
INTS = ("top_k", "seed", "index", "step", "row", "history_slot", "bias_slot")  # SampleRows.ints columns
HISTORY_SEEN = 1 << 30  # history bit: the token is in the prompt; the bits below count it in the output
MAX_LOGPROBS = 20
BLOCK_V = 2048
PIVOTS = 4
CAP = 512  # candidates a row gathers and sorts at most (top-k, the top-p nucleus, the top-N)
BIG = tl.constexpr(2147483647)
MAX_ROUNDS = tl.constexpr(64)  # a bound for the graph's sake: a round halves the candidates' rank or better


@triton.jit
def _sample_kernel(logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b, scratch_ptr,
                   tok_ptr, lp_ptr, ids_ptr, lps_ptr, sweeps_ptr, V, N_TOP: tl.constexpr, NP: tl.constexpr,
                   LOGPROBS: tl.constexpr, RECORD: tl.constexpr, COUNT: tl.constexpr, BLOCK_V: tl.constexpr,
                   PIVOTS: tl.constexpr, CAP: tl.constexpr):
    s = tl.program_id(0)
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
    s_ptr = scratch_ptr + s.to(tl.int64) * (2 * CAP)  # [CAP] sort keys of the shaped logits' candidates
    r_ptr = s_ptr + CAP  # [CAP] those of the raw logits'
    hot = temp > 0
    inv_t = tl.math.div_rn(1.0, tl.where(hot, temp, 1.0))
    filtered = hot & ((top_k > 0) | (top_p < 1.0))  # a threshold to find
    plain = hot & (filtered == 0)  # the race runs in the first sweep

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
    sweeps = tl.full([], 1, tl.int32)
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


@dataclasses.dataclass(frozen=True, slots=True)
class SampleRows:
    """Each draw's parameters on the device, one row per draw: floats [S, 6] float32 (FLOATS: a
    temperature of 0 is greedy, as DrawParams makes any below GREEDY_BELOW; top_p 1 and min_p 0 are
    off) and ints [S, 7] int64 (INTS: top_k <= 0 is off; seed, choice index and step key the counter
    RNG; row: the logits row the draw reads, < R; history_slot and bias_slot: the rows of `history`
    and `bias`, -1 for none). The values are DrawParams' (engine/draw_params.py), checked there. A
    graph keeps both in static buffers and copies each step's values in."""
    floats: torch.Tensor
    ints: torch.Tensor

    @classmethod
    def build(cls, temperature: Sequence[float], *, device: torch.device | str, **columns: Sequence[float] | None
              ) -> SampleRows:
        """From per-draw sequences named as FLOATS and INTS (all but temperature optional: off,
        seed/index/step 0, row s for draw s, no slots)."""
        if unknown := set(columns) - set(FLOATS) - set(INTS):
            raise TypeError(f"unknown columns {sorted(unknown)}")
        s = len(temperature)
        default = {"top_p": [1.0] * s, "min_p": [0.0] * s, "presence": [0.0] * s, "frequency": [0.0] * s,
                   "repetition": [1.0] * s, "row": list(range(s)), "history_slot": [-1] * s, "bias_slot": [-1] * s}
        cols = {"temperature": list(temperature)} | {
            name: list(columns[name]) if columns.get(name) is not None else default.get(name, [0] * s)
            for name in FLOATS[1:] + INTS}
        return cls(torch.tensor([cols[c] for c in FLOATS], dtype=torch.float32).T.contiguous().to(device),
                   torch.tensor([cols[c] for c in INTS], dtype=torch.int64).T.contiguous().to(device))


class SampleOut(NamedTuple):
    tokens: torch.Tensor  # [S] int64
    logprobs: torch.Tensor | None  # [S] float32, the chosen tokens' raw log-probs
    top_ids: torch.Tensor | None  # [S, N] int64
    top_logprobs: torch.Tensor | None  # [S, N] float32


def sample(logits: torch.Tensor, rows: SampleRows, *, history: torch.Tensor | None = None,
           bias: torch.Tensor | None = None, logprobs: int | None = None, record: bool = False,
           out: SampleOut | None = None, sweeps: torch.Tensor | None = None, block_v: int = BLOCK_V,
           pivots: int = PIVOTS, cap: int = CAP, num_warps: int = 8) -> SampleOut:
    """One token per draw row of `rows` from logits [R, V] (float32; rows may be strided). history:
    [H, V] int32, bias: [B, V] float32 (contiguous rows), needed when a draw names a slot of them.
    logprobs: None, or N in [0, MAX_LOGPROBS]: the chosen tokens' raw log-probs and the top N.
    record: add 1 to history[slot, token] for each draw with a history slot (slots distinct).
    out: tensors to write into (a graph's static outputs). sweeps: [S] int32, filled with how many
    times each row was read (tests and tools/dev/sample_bench.py). One launch, no host sync."""
    (_, v), s = logits.shape, rows.floats.shape[0]
    dev = logits.device
    assert logits.stride(1) == 1 and rows.floats.shape == (s, 6) and rows.ints.shape == (s, 7)
    assert rows.floats.is_contiguous() and rows.ints.is_contiguous() and pivots >= 2
    if logprobs is not None and not 0 <= logprobs <= min(MAX_LOGPROBS, v):
        raise ValueError(f"logprobs must be in [0, {min(MAX_LOGPROBS, v)}], got {logprobs}")
    for name, t, dt in (("history", history, torch.int32), ("bias", bias, torch.float32)):
        if t is not None and (t.dtype != dt or t.dim() != 2 or t.shape[1] != v or t.stride(1) != 1):
            raise ValueError(f"{name} must be [slots, {v}] {dt} with contiguous rows, got {t.dtype} {list(t.shape)}")
    # stand-ins never read (no draw names a slot of them): empty, so a graph holds no memset for them
    history = torch.empty(1, 1, dtype=torch.int32, device=dev) if history is None else history
    bias = torch.empty(1, 1, dtype=torch.float32, device=dev) if bias is None else bias
    n_top = logprobs or 0
    assert cap & (cap - 1) == 0 and cap >= n_top, "cap: a power of two, at least the top-N"
    if out is None:
        want = logprobs is not None
        out = SampleOut(torch.empty(s, dtype=torch.int64, device=dev),
                        torch.empty(s, dtype=torch.float32, device=dev) if want else None,
                        torch.empty(s, n_top, dtype=torch.int64, device=dev) if want else None,
                        torch.empty(s, n_top, dtype=torch.float32, device=dev) if want else None)
    if s == 0:
        return out
    lp = out.logprobs if out.logprobs is not None else out.tokens  # never written without logprobs
    ids = out.top_ids if n_top else out.tokens
    lps = out.top_logprobs if n_top else lp
    assert ids.is_contiguous() and lps.is_contiguous()
    count = out.tokens if sweeps is None else sweeps
    scratch = torch.empty(s, 2, cap, dtype=torch.int64, device=dev)  # [S, 2, CAP] sort keys
    _sample_kernel[(s,)](logits, logits.stride(0), rows.floats, rows.ints, history, history.stride(0), bias,
                         bias.stride(0), scratch, out.tokens, lp, ids, lps, count, v, N_TOP=n_top,
                         NP=triton.next_power_of_2(max(n_top, 1)), LOGPROBS=logprobs is not None, RECORD=record,
                         COUNT=sweeps is not None,
                         BLOCK_V=min(block_v, triton.next_power_of_2(v)), PIVOTS=pivots, CAP=cap, num_warps=num_warps,
                         enable_fp_fusion=False)
    return out
