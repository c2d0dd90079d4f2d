"""CUDA graphs for the prefill: one graph per packed-token bucket, captured on first use into the
decode graphs' memory pool. A step's prompts are packed back to back; the tail of the bucket is
padding on the scratch KV slot, each padding token a prompt of its own (position 0). Like the decode
graphs, a bucket has a greedy-token graph and, captured only once a step samples, a logits graph
writing into a buffer all logits graphs share.

With KernelConfig.batch_invariant the graphs hold the Triton `prompt_attention` only (without the
Triton kernels such steps run eagerly: fits), and a packed prompt may continue a cached prefix (a
prefix-cache hit) or an earlier chunk: every row's keys are gathered from the paged cache (its
positions 0 .. end-1, rows back to back: PrefillInputs.bank_index), so the graphs are keyed by the
token bucket and the key-bank bucket; a pack of fresh prompts has a bank of its own tokens, the size
of its token bucket. Without batch invariance only fresh prompts are graphed.

Off CUDA the same code runs each step eagerly (cuda_graphs.EagerGraph), so it is tested on the CPU."""
from __future__ import annotations

import numpy as np
import torch

from pegainfer.engine.batch import RowInput
from pegainfer.engine.cuda_graphs import EagerGraph, bucket, capture, finish_read, host_buffer, start_read, write_into
from pegainfer.engine.kv_cache import MLACache
from pegainfer.engine.model.inputs import PrefillInputs
from pegainfer.engine.model.model import DeepseekV2
from pegainfer.engine.model.prefill import prefill_logits, prefill_step
from pegainfer.engine.startup_log import log_event

TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 3072, 4096, 5120, 6144, 8192)
BANK_BUCKETS = (1024, 2048, 4096, 6144, 8192, 12288, 16384, 24576, 32768)  # keys of packs continuing prefixes
MAX_ROWS = 64  # prompts per graphed prefill step; larger steps run eagerly


class PrefillGraphs:
    def __init__(self, model: DeepseekV2, cache: MLACache, pool, max_tokens: int):
        self.model = model
        self.cache = cache
        self.pool = pool
        attn = model.layers[0].attn
        self.eager_only = attn.invariant and not attn.fused_prefill  # the torch form reads the host
        self.banked = attn.invariant and attn.fused_prefill  # keys gathered from the cache
        # a pack is bounded by the step's prefill budget, not by one prompt's length (max_len): many
        # short prompts may fill a bucket longer than any one of them
        self.buckets = [b for b in TOKEN_BUCKETS if b < max_tokens] + [max_tokens]
        self.bank_buckets = sorted({*BANK_BUCKETS, self.buckets[-1]})
        self.max_rows = MAX_ROWS
        dev = cache.data.device
        self.on_cuda = dev.type == "cuda"
        n, nb = self.buckets[-1], self.bank_buckets[-1]
        # two sets of pinned host buffers, used in turn: a launch's inputs are written while the launch
        # before may still be queued on the stream (a launched successor holding prompt rows), and its
        # tokens land in their own set
        self.host_sets = [self._host_set(n, nb) for _ in range(2)]
        self._use(0)
        self.static = torch.zeros(5, n, dtype=torch.int64, device=dev)
        self.static_last = torch.zeros(self.max_rows, dtype=torch.int64, device=dev)
        self.static_bank = torch.zeros(nb, dtype=torch.int64, device=dev)
        self.tokens_out = torch.zeros(self.max_rows, dtype=torch.int64, device=dev)  # off CUDA: the greedy tokens
        # a launch's tokens kept outside the graphs' shared memory pool: a decode graph replayed after
        # it may reuse the pool's memory that held the prefill graph's output (DecodeGraphs.follow reads these)
        self.kept = torch.zeros(self.max_rows, dtype=torch.int64, device=dev)
        self.graphs: dict[tuple[int, int, bool, bool], tuple] = {}  # (tokens, bank, logits, one prompt)
        self.logits_out: torch.Tensor | None = None  # [max_rows, V], allocated with the first logits graph

    def _host_set(self, n: int, nb: int) -> tuple:
        """ids / pos / slot / row / base [5, n], the rows' last tokens, the key bank, the tokens read
        back; then numpy views of the first three (the same memory)."""
        host = host_buffer((5, n), self.on_cuda)
        last = host_buffer((self.max_rows,), self.on_cuda)
        bank = host_buffer((nb,), self.on_cuda)
        return host, last, bank, host_buffer((self.max_rows,), self.on_cuda), host.numpy(), last.numpy(), bank.numpy()

    def _use(self, turn: int) -> None:
        """Write the next launch's inputs into host set `turn`."""
        self.turn = turn
        (self.host, self.host_last, self.host_bank, self.host_out, self.host_np, self.host_last_np,
         self.host_bank_np) = self.host_sets[turn]

    def fits(self, rows: list[RowInput]) -> bool:
        """Whether a graph runs these prompts: few enough, within the largest bucket, an attention that a
        graph can hold (the batch-invariant torch form reads the prompts on the host), and fresh ones
        unless the keys are gathered from the cache (then within the largest bank)."""
        if self.eager_only or len(rows) > self.max_rows:
            return False
        total = sum(len(r.token_ids) for r in rows)
        if total > self.buckets[-1]:
            return False
        if self.banked:  # the keys, and a cell per padding token
            pad = bucket(total, self.buckets) - total
            return sum(r.start_pos + len(r.token_ids) for r in rows) + pad <= self.bank_buckets[-1]
        return all(r.start_pos == 0 for r in rows)

    def keys(self) -> list[tuple[int, int, bool, bool]]:
        """Every graph key a step that fits can ask for (what engine.warmup captures before serving):
        (token bucket, bank, logits, one prompt). Fresh packs have the token bucket as their bank;
        with the keys gathered from the cache (banked) a pack that continues a prefix or an earlier
        chunk has a bank bucket above its token bucket, any of them up to the largest."""
        if self.eager_only:
            return []
        if not self.banked:
            return [(t, t, lg, one) for t in self.buckets for lg in (False, True) for one in (False, True)]
        return [(t, nb, lg, False) for t in self.buckets for nb in [t] + [b for b in self.bank_buckets if b > t]
                for lg in (False, True)]

    def key(self, rows: list[RowInput], logits: bool) -> tuple[int, int, bool, bool]:
        """The graph a step of these rows (that fit) replays, without touching the inputs."""
        total = sum(len(r.token_ids) for r in rows)
        t = bucket(total, self.buckets)
        if not self.banked:
            return t, t, logits, len(rows) == 1
        at = sum(r.start_pos + len(r.token_ids) for r in rows)
        return t, t if at == total else bucket(at + t - total, self.bank_buckets), logits, False

    def warm(self, keys: list[tuple[int, int, bool, bool]]) -> None:
        """Capture these graphs now (on padding only: no request's KV is touched)."""
        for k in keys:
            if k not in self.graphs:
                self._capture(*k)

    def run(self, rows: list[RowInput], logits: bool = False):
        """The greedy token of every prompt (list[int]), or with logits=True the graph's static
        [R, V] logits of their last tokens (the caller copies them before the next replay)."""
        if logits:
            return self._replay(rows, True)
        return self.read(self.launch(rows)[1])

    def launch(self, rows: list[RowInput], keep: bool = False) -> tuple[torch.Tensor, object]:
        """Start the prompts' greedy step without waiting for it: (the tokens on the device, [R], valid
        until the next replay, or with keep=True in a buffer of their own until the next launch; what
        read() turns into the list). Two may be on their way (the host buffers go in turn); read the
        first before a third."""
        out = self._replay(rows, False)
        started = start_read(out, self.host_out) if self.on_cuda else out.tolist()
        if keep:  # outside the graphs' shared pool, which a decode graph replayed next may reuse
            kept = self.kept[: out.shape[0]]
            kept.copy_(out, non_blocking=True)
            out = kept
        return out, started

    @staticmethod
    def read(launched) -> list[int]:
        """A launched step's tokens (waits for the device with the GIL released)."""
        return launched if isinstance(launched, list) else finish_read(launched)

    def _replay(self, rows: list[RowInput], logits: bool) -> torch.Tensor:
        """Write the rows into the static inputs and replay the graph: its output's first len(rows)
        rows (tokens, or logits)."""
        self._use(self.turn ^ 1)
        total = sum(len(r.token_ids) for r in rows)
        t = bucket(total, self.buckets)
        ids, pos, slots, row_ids, bases, last = [], [], [], [], [], []
        for i, r in enumerate(rows):
            n = len(r.token_ids)
            ids += r.token_ids
            pos += range(r.start_pos, r.start_pos + n)
            slots += [r.slot] * n
            row_ids += [i] * n
            last.append(len(ids) - 1)
        h = self.host_np  # numpy views: no torch op per input on the host
        h[:4, :total] = [ids, pos, slots, row_ids]
        nb = t
        if self.banked:
            nb = self._bank(rows, h, total, t)
        self._pad(total, t)
        self.host_last_np[: len(rows)] = last
        self.host_last_np[len(rows):] = 0
        self.static[:, :t].copy_(self.host[:, :t], non_blocking=True)
        self.static_last.copy_(self.host_last, non_blocking=True)
        if self.banked:
            self.static_bank[:nb].copy_(self.host_bank[:nb], non_blocking=True)
        one = len(rows) == 1 and not self.banked  # one fresh prompt: causal attention without the T x T mask
        graph, out = self.graphs.get((t, nb, logits, one)) or self._capture(t, nb, logits, one)
        graph.replay()
        return out[: len(rows)]

    def _bank(self, rows: list[RowInput], h: np.ndarray, total: int, t: int) -> int:
        """Each row's keys, positions 0 .. end-1, back to back in the bank (their flat cache rows from
        the slot's pages), then each padding token's own cell; h[4]: each token's bank base. Returns
        the bank bucket: the token bucket for fresh prompts (the bank is the pack), else a larger one."""
        page, at, i = self.cache.page_size, 0, 0
        bank = self.host_bank_np
        for r in rows:
            end, n = r.start_pos + len(r.token_ids), len(r.token_ids)
            p = np.arange(end)
            bank[at:at + end] = np.asarray(self.cache.slot_pages[r.slot])[p // page] * page + p % page
            h[4, i:i + n] = at
            at, i = at + end, i + n
        nb = t if at == total else bucket(at + t - total, self.bank_buckets)
        scratch = self.cache.scratch_page * page
        bank[at:nb] = scratch  # the padding tokens' cells (all one: they are never read back)
        h[4, total:t] = np.arange(at, at + t - total)
        return nb

    def _pad(self, start: int, end: int) -> None:
        h = self.host_np
        h[0, start:end] = 0
        h[1, start:end] = 0  # position 0: a prompt of one token, which attends to itself only
        h[2, start:end] = self.cache.scratch_slot
        h[3, start:end] = np.arange(self.max_rows, self.max_rows + end - start)
        if not self.banked:
            h[4, start:end] = 0

    def _inputs(self, t: int, nb: int) -> PrefillInputs:
        s = self.static
        if not self.banked:
            return PrefillInputs(s[0, :t], s[1, :t], s[2, :t], s[3, :t], self.static_last)
        return PrefillInputs(s[0, :t], s[1, :t], s[2, :t], s[3, :t], self.static_last, self.static_bank[:nb], s[4, :t])

    def _capture(self, t: int, nb: int, logits: bool, one: bool) -> tuple:
        fn = self._logits_fn() if logits else self._tokens_fn()
        inp = self._inputs(t, nb)
        if not self.on_cuda:
            self.graphs[(t, nb, logits, one)] = (EagerGraph(lambda: fn(self.model, inp, self.cache, one)),
                                                  self.logits_out if logits else self.tokens_out)
            return self.graphs[(t, nb, logits, one)]
        torch.cuda.current_stream().synchronize()  # the step's host->device copies must land first
        saved = (self.static[:, :t].clone(), self.static_last.clone(), self.static_bank[:nb].clone())
        self._pad(0, t)  # warm up on the scratch slot only
        self.host_np[4, :t] = np.arange(t) if self.banked else 0
        self.host_bank_np[:nb] = self.cache.scratch_page * self.cache.page_size
        self.static[:, :t].copy_(self.host[:, :t])
        self.static_bank[:nb].copy_(self.host_bank[:nb])
        self.static_last.zero_()
        with self.model.routes.uncounted():  # the warm-up step is no step of the engine's
            graph, out = capture(lambda: fn(self.model, inp, self.cache, one), self.pool,
                                 self.model.kernels.capture_priority)
        self.static[:, :t].copy_(saved[0])
        self.static_last.copy_(saved[1])
        self.static_bank[:nb].copy_(saved[2])
        self.graphs[(t, nb, logits, one)] = (graph, out)
        log_event("cuda_graph_captured", kind="prefill", tokens=t, bank=nb, logits=logits, one_prompt=one,
                  graphs=len(self.graphs))
        return graph, out

    def _tokens_fn(self):
        if self.on_cuda:
            return prefill_step
        buf = self.tokens_out
        return lambda model, inp, cache, one: write_into(buf, prefill_step(model, inp, cache, one))

    def _logits_fn(self):
        """The prefill step that leaves its [max_rows, V] logits in the shared output buffer."""
        if self.logits_out is None:
            head = self.model.lm_head  # [V, H]
            self.logits_out = torch.empty(self.max_rows, head.shape[0], dtype=self.model.logits_dtype,
                                          device=head.device)
        buf = self.logits_out
        return lambda model, inp, cache, one: write_into(buf, prefill_logits(model, inp, cache, one))
