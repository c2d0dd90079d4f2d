"""The whole token choice of a step in one launch, one program per draw row: logit_bias, the
penalties, the greedy pick, temperature, min-p, top-k, top-p, the seeded exponential-race draw,
the chosen token's raw log-prob and the top-N raw log-probs, with engine/sampler.py's semantics and
order of operations, and without a sort: the row is swept in BLOCK_V tiles a few times
(engine/kernels/sample_sweeps.py). A row's result reads only that row and its own parameters, in
a fixed order: the same bits at every batch size and position (batch-invariant by construction).
Every per-row parameter is a device tensor and no shape depends on the data, so the launch can be
captured in a CUDA graph.

What a row costs, in sweeps of its logits: greedy rows 1; temperature (and min-p) rows 1, 2 where
the race's winner falls below min-p; top-k and top-p rows 1 + the threshold search (2-5 sweeps,
the later ones mostly skip blocks that hold nothing of the band) + 1 draw; log-probs add the top-N
search and one gather.

Semantics against engine.sampler.sample (tests/engine/kernels/test_sample.py checks them):
- bias and penalties: the same float32 ops in the same order (FMA contraction is off), so the
  shaped logits and the greedy token are bit-identical; torch.argmax's first-of-equal-maxima rule
  (and its first NaN). A row without a bias or history slot is left untouched, where torch clamps
  every row of a batch that has any: they differ only for a raw logit beyond +-1e30 (infinite).
- draw: argmax(x / T - log E) rather than argmax(softmax(x / T) / E): equal in law and in exact
  arithmetic; the two roundings can pick differently only where two keys agree to ~1e-7.
- min-p keeps e >= min_p with e = exp(x / T - max), torch keeps p >= min_p * max(p); top-k and top-p
  rank by the shaped logit (ties by column), torch by the probability after its sort (ties in an
  unspecified order); top-p compares the mass before an entry with top_p times the total, summed in
  another order than torch's cumsum. So the kept sets agree unless an entry sits within float
  rounding (~1e-6 relative) of a boundary, or ties straddle it: then this kernel keeps the tied
  entries of lowest column, as many as top-k / top-p allow.
- log-probs are x - max - log(sum(exp(x - max))) of the raw logits (torch's log_softmax up to
  rounding), the top-N in torch.topk's order with ties by column ascending.

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
from pegainfer.engine.kernels.sample_sweeps import draw, gather_top, shaped, threshold

FLOATS = ("temperature", "top_p", "min_p", "presence", "frequency", "repetition")  # SampleRows.floats columns
INTS = ("top_k", "seed", "index", "step", "row", "history_slot", "bias_slot")  # SampleRows.ints columns
HISTORY_SEEN = 1 << 30  # history bit: the token is in the prompt; the bits below count it in the output
MAX_LOGPROBS = 20
BLOCK_V = 2048
PIVOTS = 4
BIG = tl.constexpr(2147483647)


@triton.jit
def _sample_kernel(logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b,
                   tok_ptr, lp_ptr, ids_ptr, lps_ptr, V, N_TOP: tl.constexpr, NP: tl.constexpr,
                   LOGPROBS: tl.constexpr, RECORD: tl.constexpr, BLOCK_V: tl.constexpr, PIVOTS: tl.constexpr):
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
    hot = temp > 0
    plain = hot & (top_k <= 0) & (top_p >= 1.0)  # no threshold to find: the race runs in the first sweep

    # sweep 1: the greedy pick of the shaped logits, the raw log-sum-exp, the plain rows' race
    g_val = float("-inf")
    g_idx = -1
    g_nan = BIG
    r_m = float("-inf")
    r_s = 0.0
    w_xs = 0.0
    w_ln = 0.0
    w_idx = -1
    w_x = 0.0
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
            # keys relative to the block's max, then blocks compared by differences: a noise term
            # never vanishes in the rounding of a huge x / T (ties at 1e30 from bias or penalties)
            xs = tl.math.div_rn(x, temp)
            ln = log_noise(state, cols)
            ref = tl.where(m > float("-inf"), tl.math.div_rn(m, temp), 0.0)
            key = tl.where(ok, (xs - ref) - ln, float("-inf"))
            k = tl.max(key, axis=0)
            i = tl.min(tl.where(ok & (key == k), cols, BIG), axis=0)
            i_xs = tl.sum(tl.where(cols == i, xs, 0.0), axis=0)
            i_ln = tl.sum(tl.where(cols == i, ln, 0.0), axis=0)
            won = ((i_xs - w_xs) - (i_ln - w_ln) > 0) | (w_idx < 0)
            w_x = tl.where(won, tl.sum(tl.where(cols == i, x, 0.0), axis=0), w_x)
            w_idx = tl.where(won, i, w_idx)
            w_xs = tl.where(won, i_xs, w_xs)
            w_ln = tl.where(won, i_ln, w_ln)
    token = tl.where(g_nan < BIG, g_nan, g_idx)

    if hot:
        top = tl.math.div_rn(g_val, temp)  # max(x / T): rounding division by T > 0 keeps the order
        t_lo = float("-inf")
        t_hi = float("-inf")
        r = 1
        n = 1
        redraw = True
        if plain:
            token = w_idx
            redraw = tl.exp(tl.math.div_rn(w_x, temp) - top) < min_p  # the winner fell below min-p
        else:
            base = -1.0  # the total mass top-p takes its share of; -1: all entries (no top-k cut)
            k_lo = float("-inf")
            k_r = 1
            k_n = 1
            for phase in range(2):  # top-k by count, then top-p by mass over what top-k kept
                by_mass = phase == 1
                if tl.where(by_mass, top_p < 1.0, top_k > 0):
                    goal = tl.where(by_mass, top_p, top_k.to(tl.float32))
                    p_lo, p_hi, p_r, p_n, m_lo, m_hi, e_v, active = threshold(
                        x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency, repetition, V, temp, top, min_p,
                        g_val, t_lo, goal, tl.where(by_mass, base, 1.0), by_mass, False, BLOCK_V, PIVOTS)
                    if active:
                        if by_mass:
                            # both stop at the same tied value: keep no more ties than top-k allowed
                            p_r = tl.where((k_r < k_n) & (p_lo == k_lo), tl.minimum(p_r, k_r), p_r)
                        else:
                            base = tl.where(p_r < p_n, m_hi + p_r.to(tl.float32) * e_v, m_lo)
                            k_lo = p_lo
                            k_r = p_r
                            k_n = p_n
                        t_lo = p_lo
                        t_hi = p_hi
                        r = p_r
                        n = p_n
        if redraw:
            token = draw(x_ptr, h_ptr, b_ptr, has_h, has_b, presence, frequency, repetition, V, temp, top, min_p,
                         state, t_lo, t_hi, r, n, BLOCK_V)
    tl.store(tok_ptr + s, token.to(tl.int64))

    if LOGPROBS:
        log_s = tl.log(r_s)
        tl.store(lp_ptr + s, (tl.load(x_ptr + token).to(tl.float32) - r_m) - log_s)
        if N_TOP > 0:
            n_lo, n_hi, n_r, n_n, _, _, _, _ = threshold(
                x_ptr, h_ptr, b_ptr, False, False, presence, frequency, repetition, V, 1.0, 0.0, 0.0,
                r_m, float("-inf"), N_TOP, 1.0, False, True, BLOCK_V, PIVOTS)
            gather_top(x_ptr, V, n_lo, n_hi, n_r, n_n, r_m, log_s, ids_ptr + s * N_TOP, lps_ptr + s * N_TOP,
                       N_TOP, NP, BLOCK_V)
    if RECORD:
        if has_h:
            tl.store(h_ptr + token, tl.load(h_ptr + token) + 1)


@dataclasses.dataclass(frozen=True, slots=True)
class SampleRows:
    """Each draw's parameters on the device, one row per draw: floats [S, 6] float32 (FLOATS: a
    temperature of 0 is greedy; top_p 1 and min_p 0 are off) and ints [S, 7] int64 (INTS: top_k <= 0
    is off; seed, choice index and step key the counter RNG; row: the logits row the draw reads;
    history_slot and bias_slot: the rows of `history` and `bias`, -1 for none). A graph keeps both
    in static buffers and copies each step's values in."""
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
           out: SampleOut | None = None, block_v: int = BLOCK_V, pivots: int = PIVOTS,
           num_warps: int = 8) -> SampleOut:
    """One token per draw row of `rows` from logits [R, V] (float32; rows may be strided). history:
    [H, V] int32, bias: [B, V] float32 (contiguous rows), needed when a draw names a slot of them.
    logprobs: None, or N in [0, MAX_LOGPROBS]: the chosen tokens' raw log-probs and the top N.
    record: add 1 to history[slot, token] for each draw with a history slot (slots distinct).
    out: tensors to write into (a graph's static outputs). One launch, no host sync."""
    (_, v), s = logits.shape, rows.floats.shape[0]
    dev = logits.device
    assert logits.stride(1) == 1 and rows.floats.shape == (s, 6) and rows.ints.shape == (s, 7)
    assert rows.floats.is_contiguous() and rows.ints.is_contiguous() and pivots >= 2
    if logprobs is not None and not 0 <= logprobs <= min(MAX_LOGPROBS, v):
        raise ValueError(f"logprobs must be in [0, {min(MAX_LOGPROBS, v)}], got {logprobs}")
    for name, t, dt in (("history", history, torch.int32), ("bias", bias, torch.float32)):
        if t is not None and (t.dtype != dt or t.dim() != 2 or t.shape[1] != v or t.stride(1) != 1):
            raise ValueError(f"{name} must be [slots, {v}] {dt} with contiguous rows, got {t.dtype} {list(t.shape)}")
    history = torch.zeros(1, 1, dtype=torch.int32, device=dev) if history is None else history
    bias = torch.zeros(1, 1, dtype=torch.float32, device=dev) if bias is None else bias
    n_top = logprobs or 0
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
    _sample_kernel[(s,)](logits, logits.stride(0), rows.floats, rows.ints, history, history.stride(0), bias,
                         bias.stride(0), out.tokens, lp, ids, lps, v, N_TOP=n_top,
                         NP=triton.next_power_of_2(max(n_top, 1)), LOGPROBS=logprobs is not None, RECORD=record,
                         BLOCK_V=min(block_v, triton.next_power_of_2(v)), PIVOTS=pivots, num_warps=num_warps,
                         enable_fp_fusion=False)
    return out
