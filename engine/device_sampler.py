"""The token choice of a decode graph's rows on the device (issue 33): the state the one-launch sampler
(engine/kernels/sample.py) reads, kept where the graph finds it, so that one captured graph serves
every mix of greedy, temperature, top-k/top-p/min-p, penalties, logit_bias, seeds and log-probs.

- per KV slot: `history` [slots, V] int32, the request's prompt tokens (HISTORY_SEEN) and its output
  tokens' counts, the penalties' input. It is built from the sequence's ids the first time the
  sequence decodes here (its first token came from its prompt row, chosen by engine.sampler), and
  from then on the step itself adds each chosen token (record=True): the host never rebuilds it.
  `bias` [slots, V] float32, the request's dense logit_bias row, written at that same first step.
  At 256 slots of DeepSeek's 102,400-entry vocabulary each is 100 MiB (KV sizing keeps 6 GiB spare).
  Only penalised draws name a history slot and only biased ones a bias slot; the others never read
  them (the kernel leaves their logits untouched).
- per step: the rows' parameters as SampleRows (floats [S, 6], ints [S, 7]) in one static device
  block, copied in from a pinned host block (two, used in turn, as the graphs' inputs) before the
  replay; and the log-prob outputs (the chosen token's and the top MAX_LOGPROBS, cut per draw on the
  host), read back through one pinned block.

Every value reaching the device was checked on the host first: DrawParams at admission (engine/
draw_params.py); a draw that arrives without them is converted here, and one that fails fails alone
(its row runs greedy and its token is dropped), as engine.request_guard promises.

Off CUDA (or when asked) the same state drives engine.sampler.sample instead of the kernel, so the
CPU runs the identical bookkeeping with the reference sampler's choices."""
from __future__ import annotations

import numpy as np
import torch

from pegainfer.engine.batch import RowInput
from pegainfer.engine.draw_params import DrawParams
from pegainfer.engine.kernels.config import SampleTiling
from pegainfer.engine.kernels.sample_rows import FLOATS, HISTORY_SEEN, INTS, MAX_LOGPROBS, SampleOut, SampleRows
from pegainfer.engine.sampler import Draw, SamplingBatch, sample as reference_sample

_GREEDY = DrawParams(temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, presence=0.0, frequency=0.0, repetition=1.0,
                     seed=0, logprobs=None)
_PAD_FLOATS = (0.0, 1.0, 0.0, 0.0, 0.0, 1.0)  # greedy, every filter off, neutral penalties
_NF, _NI = len(FLOATS), len(INTS)
_WORDS = _NI + _NF // 2  # int64 words a row's parameters take (the floats two to a word)


class DeviceSampler:
    def __init__(self, slots: int, vocab: int, max_batch: int, device: torch.device, *, kernel: bool,
                 tiling: SampleTiling = SampleTiling()):
        """slots: the KV cache's slot count (the scratch slot included); kernel: the Triton launch
        (False: engine.sampler.sample on the same state); tiling: its launch (KernelConfig.sample:
        one program per row, or each row split over a fixed number of programs)."""
        self.vocab, self.kernel, self.max_batch, self.tiling = vocab, kernel, max_batch, tiling
        self.tickets = torch.zeros(max_batch, dtype=torch.int32, device=device)  # the split launch's, at rest 0
        self.top_n = min(MAX_LOGPROBS, vocab)
        self.history = torch.zeros(slots, vocab, dtype=torch.int32, device=device)  # [slots, V]
        self.bias = torch.zeros(slots, vocab, dtype=torch.float32, device=device)  # [slots, V]
        self.owner: list[object] = [None] * slots  # the output_ids list whose history the slot holds
        self.recorded = [0] * slots  # how many of its output tokens it counts (launched steps included)
        self.bias_owner: list[object] = [None] * slots
        m, n = max_batch, self.top_n
        pinned = device.type == "cuda"
        # parameters: [m, 7] int64 then [m, 6] float32, one block (one copy a step)
        self.params = torch.zeros(_WORDS * m, dtype=torch.int64, device=device)
        self.ints, self.floats = _param_views(self.params, m)
        self.host = [_zeros(_WORDS * m, torch.int64, pinned) for _ in range(2)]
        self.host_np = [tuple(t.numpy() for t in _param_views(h, m)) for h in self.host]
        # log-prob outputs: top ids [m, N] int64, then top log-probs [m, N] and chosen ones [m] float32
        self.lp_block = torch.zeros(n * m + (n * m + m + 1) // 2, dtype=torch.int64, device=device)
        self.lp_out = _lp_views(self.lp_block, m, n)
        self.lp_host = [_zeros(self.lp_block.numel(), torch.int64, pinned) for _ in range(2)]
        self.lp_host_np = [tuple(t.numpy() for t in _lp_views(h, m, n)) for h in self.lp_host]

    # ---- the host, before a replay ----------------------------------------------------------------
    def fill(self, rows: list[RowInput], draws: list[Draw], turn: int, b: int) -> dict[int, str]:
        """Write the parameters of draws[i], which reads graph row i (rows[i]'s KV slot; its Draw.row,
        the plan's row, is not read), padded to b rows, and copy them in; bring the history and bias rows the draws name up to date. Returns
        the draws that failed on their own values (index -> why): they run greedy, unrecorded."""
        n = len(draws)
        if n != len(rows):
            raise ValueError(f"{n} draws for {len(rows)} graph rows: one draw per row, in order")
        ints, floats = self.host_np[turn]
        failed: dict[int, str] = {}
        ps = []
        for i, d in enumerate(draws):
            p = d.params
            if p is None:
                try:
                    p = d.checked(self.vocab)
                except (TypeError, ValueError) as e:
                    failed[i] = f"{type(e).__name__}: {e}"
                    p = _GREEDY
            ps.append(p)
        floats[:n] = [(p.temperature, p.top_p, p.min_p, p.presence, p.frequency, p.repetition) for p in ps]
        ints[:n] = [(p.top_k, p.seed, d.index, d.step, i,
                     self._history(r.slot, d) if p.penalised and i not in failed else -1,
                     self._bias(r.slot, d, p) if p.bias_ids and i not in failed else -1)
                    for i, (d, p, r) in enumerate(zip(draws, ps, rows))]
        self.pad(turn, n, b)
        self.params.copy_(self.host[turn], non_blocking=True)
        return failed

    def pad(self, turn: int, n: int, b: int) -> None:
        """Rows n..b-1: greedy, no slots (a padding row never records into a history)."""
        ints, floats = self.host_np[turn]
        floats[n:b] = _PAD_FLOATS
        ints[n:b] = 0
        ints[n:b, INTS.index("row")] = np.arange(n, b)
        ints[n:b, INTS.index("history_slot")] = -1
        ints[n:b, INTS.index("bias_slot")] = -1

    def _history(self, slot: int, d: Draw) -> int:
        if self.owner[slot] is not d.output_ids or self.recorded[slot] != d.step:
            if d.step != len(d.output_ids):  # a launched successor's row: its predecessor recorded it
                raise RuntimeError(f"slot {slot}'s history is stale and draw step {d.step} is not the "
                                   f"{len(d.output_ids)} tokens the host knows")
            row = self.history[slot]  # [V]
            row.zero_()
            if d.prompt_ids:
                row[_device(d.prompt_ids, torch.int64, row.device)] = HISTORY_SEEN
            if d.output_ids:
                ids = _device(d.output_ids, torch.int64, row.device)
                row.index_add_(0, ids, torch.ones(len(ids), dtype=torch.int32, device=row.device))
            self.owner[slot] = d.output_ids
        self.recorded[slot] = d.step + 1  # the step adds its token
        return slot

    def _bias(self, slot: int, d: Draw, p: DrawParams) -> int:
        if self.bias_owner[slot] is not d.output_ids:
            row = self.bias[slot]  # [V]
            row.zero_()
            row[_device(p.bias_ids, torch.int64, row.device)] = _device(p.bias_values, torch.float32, row.device)
            self.bias_owner[slot] = d.output_ids
        return slot

    # ---- the device, inside the graph -------------------------------------------------------------
    def choose(self, logits: torch.Tensor, tokens: torch.Tensor, logprobs: bool, warm: list | None = None
               ) -> torch.Tensor:
        """logits [b, V] (any float dtype) -> tokens [b] int64 (written in place), the log-probs
        into the static outputs when asked; records each penalised row's token in its history.
        warm: a list the kernel's launches are recorded into instead of run (precompile)."""
        b = logits.shape[0]
        rows = SampleRows(self.floats[:b], self.ints[:b])
        ids, lps, chosen = self.lp_out
        out = SampleOut(tokens, chosen[:b], ids[:b], lps[:b]) if logprobs else SampleOut(tokens, None, None, None)
        if self.kernel:
            from pegainfer.engine.kernels.sample import sample
            t = self.tiling
            sample(logits, rows, history=self.history, bias=self.bias, logprobs=self.top_n if logprobs else None,
                   record=True, out=out, block_v=t.block_v, pivots=t.one_pivots, cap=t.cap, num_warps=t.num_warps,
                   chunks=t.chunks, split_pivots=t.pivots, tickets=self.tickets, warm=warm)
        else:
            self._reference(logits, rows, out)
        return tokens

    def precompile(self, logits_dtype: torch.dtype, threads: int) -> tuple[int, float, list[str]]:
        """Compile the kernel's launches for both graph kinds (with and without log-probs) side by
        side in `threads` threads, before the captures that would compile them one after another
        (engine/kernels/precompile.py). The arguments are the graphs' own (these buffers, logits of
        the head's dtype), so each launch's specialisation is the one a replay's capture looks up.
        Returns (launches, seconds, errors); nothing to do without the kernel or off CUDA."""
        dev = self.params.device
        if not self.kernel or dev.type != "cuda":
            return 0, 0.0, []
        from pegainfer.engine.kernels.precompile import compile_all
        warm: list = []
        logits = torch.empty(1, self.vocab, dtype=logits_dtype, device=dev)
        tokens = torch.empty(1, dtype=torch.int64, device=dev)
        for lp in (False, True):
            self.choose(logits, tokens, lp, warm=warm)
        seconds, errors = compile_all(warm, dev, threads)
        return len(warm), seconds, errors

    def _reference(self, logits: torch.Tensor, rows: SampleRows, out: SampleOut) -> None:
        """engine.sampler.sample on the same state (host-synchronising: never inside a CUDA capture)."""
        f, i = rows.floats, rows.ints
        hs, bs = i[:, INTS.index("history_slot")], i[:, INTS.index("bias_slot")]
        has_h, has_b = hs >= 0, bs >= 0
        seen = counts = bias = None
        if bool(has_h.any()):
            hist = self.history.index_select(0, hs.clamp(min=0)) * has_h[:, None]  # [b, V]
            seen, counts = (hist & HISTORY_SEEN) != 0, (hist & (HISTORY_SEEN - 1)).float()
        if bool(has_b.any()):
            dense = self.bias.index_select(0, bs.clamp(min=0)) * has_b[:, None]  # [b, V]
            at = dense.nonzero(as_tuple=True)
            bias = (at[0], at[1], dense[at])
        temp, top_k, top_p, min_p = f[:, 0], i[:, 0], f[:, 1], f[:, 2]
        hot = (temp > 0).nonzero().flatten()
        b = f.shape[0]
        batch = SamplingBatch(
            rows=i[:, INTS.index("row")], temperature=temp, top_p=top_p, top_k=top_k, min_p=min_p,
            presence=f[:, 3], frequency=f[:, 4], repetition=f[:, 5], seed=i[:, 1], index=i[:, 2], step=i[:, 3],
            seen_in_prompt=seen, output_counts=counts, bias=bias,
            hot=None if hot.numel() in (0, b) else hot, all_greedy=hot.numel() == 0,
            use_min_p=bool((min_p[hot] > 0).any()), use_top_k_top_p=bool(((top_k[hot] > 0) | (top_p[hot] < 1)).any()),
            num_logprobs=self.top_n if out.logprobs is not None else None)
        got = reference_sample(logits.float(), batch)
        out.tokens.copy_(got.tokens)
        if out.logprobs is not None:
            out.logprobs.copy_(got.logprobs)
            out.top_ids.copy_(got.top_ids)
            out.top_logprobs.copy_(got.top_logprobs)
        if bool(has_h.any()):
            self.history.index_put_((hs[has_h], got.tokens[has_h]), torch.ones_like(hs[has_h], dtype=torch.int32),
                                    accumulate=True)

    # ---- the host, after the replay ---------------------------------------------------------------
    def read_back(self, turn: int) -> None:
        """Queue the copy of the log-prob outputs to the turn's pinned block (after the replay)."""
        self.lp_host[turn].copy_(self.lp_block, non_blocking=True)

    def logprobs(self, turn: int, draws: list[Draw], failed: dict[int, str]
                 ) -> tuple[list[float | None], list[tuple]]:
        """Per draw, once the step is done: its chosen token's log-prob and its top N, where it asked."""
        ids, lps, chosen = self.lp_host_np[turn]
        n = len(draws)
        out_lp: list[float | None] = [None] * n
        out_top: list[tuple] = [()] * n
        for j, d in enumerate(draws):
            want = d.spec.logprobs
            if want is not None and j not in failed:
                out_lp[j] = float(chosen[j])
                out_top[j] = tuple(zip(ids[j, :want].tolist(), lps[j, :want].tolist()))
        return out_lp, out_top


def _param_views(block: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ints [m, 7] int64, floats [m, 6] float32) over one int64 block."""
    return block[:_NI * m].view(m, _NI), block[_NI * m:].view(torch.float32).view(m, _NF)


def _lp_views(block: torch.Tensor, m: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(top ids [m, n] int64, top log-probs [m, n] float32, chosen log-probs [m] float32)."""
    rest = block[n * m:].view(torch.float32)
    return block[:n * m].view(m, n), rest[:n * m].view(m, n), rest[n * m:n * m + m]


def _device(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list on the device without waiting for the stream (a step may be in flight): through
    pinned memory, which torch's caching host allocator keeps until the copy has run."""
    t = torch.tensor(values, dtype=dtype)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


def _zeros(n: int, dtype: torch.dtype, pinned: bool) -> torch.Tensor:
    t = torch.zeros(n, dtype=dtype)
    return t.pin_memory() if pinned else t
