"""The whole token choice of a step, on the device: logit_bias, the
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
request's dense logit_bias row; SampleRows names each draw's slot (-1: none).

Two launch shapes (KernelConfig.sample.chunks): one program per draw row, one launch (chunks 0:
`_sample_kernel`, whose row code is engine/kernels/sample_row.py); or each row's BLOCK_V tiles
split over a fixed number of programs in eight launches (engine/kernels/sample_split.py), so a
batch-1 step is spread over ~50 SMs rather than one. The steps above are the one program's; the
split runs them tile by tile and folds the tiles' parts in tile order, as the one program walks its
blocks: the same tokens and log-probs, bit for bit, wherever both take the same path (sample_split.py
says where they may not)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pegainfer.engine.kernels.precompile import launcher
from pegainfer.engine.kernels.sample_rows import MAX_LOGPROBS, SampleOut, SampleRows
from pegainfer.engine.kernels.sample_row import sample_row
from pegainfer.engine.kernels.sample_split import launch

BLOCK_V = 2048
PIVOTS = 4
CAP = 512  # candidates a row gathers and sorts at most (top-k, the top-p nucleus, the top-N)


@triton.jit
def _sample_kernel(logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b, scratch_ptr,
                   tok_ptr, lp_ptr, ids_ptr, lps_ptr, sweeps_ptr, V, N_TOP: tl.constexpr, NP: tl.constexpr,
                   LOGPROBS: tl.constexpr, RECORD: tl.constexpr, COUNT: tl.constexpr, BLOCK_V: tl.constexpr,
                   PIVOTS: tl.constexpr, CAP: tl.constexpr):
    sample_row(tl.program_id(0), 0, logits_ptr, stride_l, floats_ptr, ints_ptr, hist_ptr, stride_h, bias_ptr, stride_b,
               scratch_ptr, tok_ptr, lp_ptr, ids_ptr, lps_ptr, sweeps_ptr, V, N_TOP, NP, LOGPROBS, RECORD, COUNT,
               BLOCK_V, PIVOTS, CAP)


def sample(logits: torch.Tensor, rows: SampleRows, *, history: torch.Tensor | None = None,
           bias: torch.Tensor | None = None, logprobs: int | None = None, record: bool = False,
           out: SampleOut | None = None, sweeps: torch.Tensor | None = None, block_v: int = BLOCK_V,
           pivots: int = PIVOTS, cap: int = CAP, num_warps: int = 8, chunks: int = 0, split_pivots: int = 8,
           tickets: torch.Tensor | None = None, warm: list | None = None) -> SampleOut:
    """One token per draw row of `rows` from logits [R, V] (float32; rows may be strided). history:
    [H, V] int32, bias: [B, V] float32 (contiguous rows), needed when a draw names a slot of them.
    logprobs: None, or N in [0, MAX_LOGPROBS]: the chosen tokens' raw log-probs and the top N.
    record: add 1 to history[slot, token] for each draw with a history slot (slots distinct).
    out: tensors to write into (a graph's static outputs). sweeps: [S] int32, filled with how many
    times each row was read (tests and tools/dev/sample_bench.py). chunks 0: one launch, a program
    per row; chunks > 0: each row over min(chunks, tiles) programs of block_v-column tiles, in four
    launches (engine/kernels/sample_split.py; split_pivots its count thresholds; tickets: [>= S] int32
    zeros it leaves at zero, engine/kernels/ticket.py, made here when not given). KernelConfig.sample
    holds these knobs for the decode graph. warm: a list to record the launches into instead of running
    them (engine/kernels/precompile.py; the outputs are left unwritten). No host sync."""
    (_, v), s = logits.shape, rows.floats.shape[0]
    dev = logits.device
    assert logits.stride(1) == 1 and rows.floats.shape == (s, 6) and rows.ints.shape == (s, 7)
    assert rows.floats.is_contiguous() and rows.ints.is_contiguous() and pivots >= 2 and split_pivots >= 2
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
    block_v = min(block_v, triton.next_power_of_2(v))
    if chunks > 0:
        if tickets is None:
            tickets = torch.zeros(s, dtype=torch.int32, device=dev)
        assert tickets.dtype == torch.int32 and tickets.numel() >= s
        launch(logits, rows, history, bias, scratch, outs=(out.tokens, lp, ids, lps, count), tickets=tickets,
               n_top=n_top, logprobs=logprobs is not None, record=record, count=sweeps is not None, chunks=chunks,
               block_v=block_v, pivots=split_pivots, one_pivots=pivots, cap=cap, num_warps=num_warps, warm=warm)
        return out
    launcher(_sample_kernel, (s,), warm)(
        logits, logits.stride(0), rows.floats, rows.ints, history, history.stride(0), bias, bias.stride(0), scratch,
        out.tokens, lp, ids, lps, count, v, N_TOP=n_top, NP=triton.next_power_of_2(max(n_top, 1)),
        LOGPROBS=logprobs is not None, RECORD=record, COUNT=sweeps is not None, BLOCK_V=block_v, PIVOTS=pivots,
        CAP=cap, num_warps=num_warps, enable_fp_fusion=False)
    return out
