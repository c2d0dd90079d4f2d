"""CUDA graphs for prefill steps: one graph per packed-token bucket, captured into the decode graphs'
memory pool (at start-up by engine.warmup, or on first use). A step's prompts are packed back to back;
the tail of the bucket is padding on the scratch KV slot, each padding token a prompt of its own
(position 0). Like the decode graphs, a bucket has a greedy-token graph and a logits graph writing
into a buffer all logits graphs share.

Two forms. Fresh prompts (every row from position 0) attend within the pack. A step with a prompt
chunk whose earlier chunks are cached (a long prompt cut by the step budget) runs a bank graph, keyed
by the token bucket and a bank bucket: the key bank is gathered from the cache at fixed size (each
row's whole context, padding on the scratch slot) and read by the Triton `prompt_attention`
(MLAttention.prefill_banked), so later chunks run as fast graphs too, with the bits of the eager path.

With KernelConfig.batch_invariant the graphs hold the Triton `prompt_attention` only; without the
Triton kernels such steps run eagerly (fits), as do chunk steps without them."""
from __future__ import annotations

import numpy as np
import torch

from pegainfer.engine.batch import RowInput
from pegainfer.engine.cuda_graphs import EagerGraph, bucket, capture, host_buffer, wait_and_read, write_into
from pegainfer.engine.kv_cache import MLACache
from pegainfer.engine.model.inputs import PrefillInputs
from pegainfer.engine.model.model import DeepseekV2
from pegainfer.engine.model.prefill import prefill_logits, prefill_step
from pegainfer.engine.startup_log import log_event

TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 3072, 4096, 5120, 6144, 8192)
MAX_ROWS = 64  # prompts per graphed prefill step; larger steps run eagerly
BANK_MIN = 1024  # the smallest bank bucket (bank buckets double from here)
BANK_SPARE = 64  # bank rows beyond max_len + the token budget: the padding tokens' key


def bank_buckets(max_len: int, max_tokens: int) -> list[int]:
    """Key-bank sizes of the bank graphs: doubling from BANK_MIN, up to every row's context together
    (one prompt of max_len and fresh prompts of the rest of the token budget) and a spare."""
    cap = max_len + max_tokens + BANK_SPARE
    out, n = [], BANK_MIN
    while n < cap:
        out.append(n)
        n *= 2
    return out + [cap]


class PrefillGraphs:
    def __init__(self, model: DeepseekV2, cache: MLACache, pool, max_tokens: int):
        self.model = model
        self.cache = cache
        self.pool = pool
        # a pack is bounded by the step's prefill budget, not by one prompt's length (max_len): many
        # short prompts may fill a bucket longer than any one of them
        self.buckets = [b for b in TOKEN_BUCKETS if b < max_tokens] + [max_tokens]
        self.bank_buckets = bank_buckets(cache.max_len, self.buckets[-1])
        self.max_rows = MAX_ROWS
        dev = cache.data.device
        self.on_cuda = dev.type == "cuda"
        n, nb = self.buckets[-1], self.bank_buckets[-1]
        self.host = host_buffer((5, n), self.on_cuda)  # ids, pos, slot, row, base (bank graphs)
        # the bank's slots then positions, as one contiguous [2, bank bucket] block per bucket at the
        # front of a flat buffer, so that its host->device copy stays a plain asynchronous one
        self.host_bank = host_buffer((2 * nb,), self.on_cuda)
        self.host_last = host_buffer((self.max_rows,), self.on_cuda)
        self.host_np, self.host_last_np = self.host.numpy(), self.host_last.numpy()  # the same memory
        self.host_bank_np = self.host_bank.numpy()
        self.arange = np.arange(nb, dtype=np.int64)
        self.host_out = host_buffer((self.max_rows,), self.on_cuda)
        self.static = torch.zeros(5, n, dtype=torch.int64, device=dev)
        self.static_bank = torch.zeros(2 * nb, dtype=torch.int64, device=dev)
        self.static_last = torch.zeros(self.max_rows, dtype=torch.int64, device=dev)
        # (tokens, bank (0: fresh prompts), logits, one prompt) -> (graph, output)
        self.graphs: dict[tuple[int, int, bool, bool], tuple] = {}
        self.logits_out: torch.Tensor | None = None  # [max_rows, V], allocated with the first logits graph

    def fits(self, rows: list[RowInput]) -> bool:
        """Whether a graph runs these prompts: few enough, within the largest bucket, and an attention
        that a graph can hold (the batch-invariant torch form reads the prompts on the host); chunks
        over an earlier cache need the Triton prompt attention and a bank within the largest."""
        attn = self.model.layers[0].attn
        if attn.invariant and not attn.fused_prefill:
            return False
        if len(rows) > self.max_rows or sum(len(r.token_ids) for r in rows) > self.buckets[-1]:
            return False
        if all(r.start_pos == 0 for r in rows):
            return True
        return attn.fused_prefill and sum(r.start_pos + len(r.token_ids) for r in rows) < self.bank_buckets[-1]

    def keys(self) -> list[tuple[int, int, bool, bool]]:
        """Every graph key a step that fits can ask for (what engine.warmup captures before serving):
        fresh packs per token bucket, and bank graphs per (token bucket, bank bucket) pair some step
        can reach (its bank holds more than its tokens, and at most max_len more)."""
        attn = self.model.layers[0].attn
        if attn.invariant and not attn.fused_prefill:
            return []
        ones = (False,) if attn.invariant else (False, True)
        out = [(t, 0, lg, one) for t in self.buckets for lg in (False, True) for one in ones]
        if attn.fused_prefill:
            t_prev = 0
            for t in self.buckets:
                n_prev = 0
                for nb in self.bank_buckets:
                    if nb >= t_prev + 3 and n_prev <= self.cache.max_len + t:
                        out += [(t, nb, lg, False) for lg in (False, True)]
                    n_prev = nb
                t_prev = t
        return out

    def key(self, rows: list[RowInput], logits: bool) -> tuple[int, int, bool, bool]:
        """The graph a step of these rows (that fit) replays."""
        t = bucket(sum(len(r.token_ids) for r in rows), self.buckets)
        if all(r.start_pos == 0 for r in rows):  # one prompt: causal attention without the T x T mask
            return t, 0, logits, len(rows) == 1 and not self.model.layers[0].attn.invariant
        return t, bucket(sum(r.start_pos + len(r.token_ids) for r in rows) + 1, self.bank_buckets), logits, False

    def warm(self, keys: list[tuple[int, int, bool, bool]]) -> None:
        """Capture these graphs now (on padding only: no request's KV is touched)."""
        for k in keys:
            if k not in self.graphs:
                self._capture(*k)

    def run(self, rows: list[RowInput], logits: bool = False):
        """The greedy token of every prompt (list[int]), or with logits=True the graph's static
        [R, V] logits of their last tokens (the caller copies them before the next replay)."""
        key = self.key(rows, logits)
        t, nb = key[0], key[1]
        ids, pos, slots, row_ids, bases, last = [], [], [], [], [], []
        hb, ar = self.host_bank_np[: 2 * nb].reshape(2, nb), self.arange
        used = 0  # bank rows filled
        for i, r in enumerate(rows):
            n, s = len(r.token_ids), r.start_pos
            ids += r.token_ids
            pos += range(s, s + n)
            slots += [r.slot] * n
            row_ids += [i] * n
            if nb:
                bases += [used] * n
                hb[0, used:used + s + n] = r.slot
                hb[1, used:used + s + n] = ar[:s + n]
                used += s + n
            last.append(len(ids) - 1)
        total = len(ids)
        h = self.host_np  # numpy views: no torch op per input on the host
        h[:4, :total] = [ids, pos, slots, row_ids]
        h[4, :total] = bases if nb else 0
        self._pad(total, t, used)
        self.host_last_np[: len(rows)] = last
        self.host_last_np[len(rows):] = 0
        self.static[:, :t].copy_(self.host[:, :t], non_blocking=True)
        if nb:
            self._pad_bank(used, nb)
            self.static_bank[: 2 * nb].copy_(self.host_bank[: 2 * nb], non_blocking=True)
        self.static_last.copy_(self.host_last, non_blocking=True)
        graph, out = self.graphs.get(key) or self._capture(*key)
        graph.replay()
        if logits:
            return out[: len(rows)]
        return wait_and_read(out[: len(rows)], self.host_out) if self.on_cuda else out[: len(rows)].tolist()

    def _pad(self, start: int, end: int, base: int = 0) -> None:
        h = self.host_np
        h[0, start:end] = 0
        h[1, start:end] = 0  # position 0: a prompt of one token, which attends to itself only
        h[2, start:end] = self.cache.scratch_slot
        h[3, start:end] = np.arange(self.max_rows, self.max_rows + end - start)
        h[4, start:end] = base  # bank graphs: the first padding bank row, the scratch slot's position 0

    def _pad_bank(self, start: int, nb: int) -> None:
        """Bank rows [start, nb) of bucket nb: the scratch slot's position 0."""
        hb = self.host_bank_np[: 2 * nb].reshape(2, nb)
        hb[0, start:] = self.cache.scratch_slot
        hb[1, start:] = 0

    def _inputs(self, t: int, nb: int) -> PrefillInputs:
        s, b = self.static, self.static_bank[: 2 * nb].view(2, nb)
        if not nb:
            return PrefillInputs(s[0, :t], s[1, :t], s[2, :t], s[3, :t], self.static_last)
        return PrefillInputs(s[0, :t], s[1, :t], s[2, :t], s[3, :t], self.static_last,
                             bank_slots=b[0, :nb], bank_pos=b[1, :nb], bases=s[4, :t])

    def _capture(self, t: int, nb: int, logits: bool, one: bool) -> tuple:
        if self.on_cuda:
            torch.cuda.current_stream().synchronize()  # the step's host->device copies must land first
        saved, saved_last = self.static[:, :t].clone(), self.static_last.clone()
        saved_bank = self.static_bank.clone()
        self._pad(0, t)  # warm up on the scratch slot only
        self._pad_bank(0, nb)
        self.static[:, :t].copy_(self.host[:, :t])
        self.static_bank[: 2 * nb].copy_(self.host_bank[: 2 * nb])
        self.static_last.zero_()
        inp = self._inputs(t, nb)
        fn = self._logits_fn() if logits else prefill_step
        with self.model.routes.uncounted():  # the warm-up step is no step of the engine's
            if self.on_cuda:
                graph, out = capture(lambda: fn(self.model, inp, self.cache, one), self.pool,
                                     self.model.kernels.capture_priority)
            else:  # off CUDA (the CPU tests): the step itself on every replay, into one output buffer
                out = fn(self.model, inp, self.cache, one).clone()
                graph = EagerGraph(lambda: write_into(out, fn(self.model, inp, self.cache, one)))
        self.static[:, :t].copy_(saved)
        self.static_bank.copy_(saved_bank)
        self.static_last.copy_(saved_last)
        self.graphs[(t, nb, logits, one)] = (graph, out)
        log_event("cuda_graph_captured", kind="prefill", tokens=t, bank=nb, logits=logits, one_prompt=one,
                  graphs=len(self.graphs))
        return graph, out

    def _logits_fn(self):
        """The prefill step that leaves its [max_rows, V] logits in the shared output buffer."""
        if self.logits_out is None:
            head = self.model.lm_head  # [V, H]
            self.logits_out = torch.empty(self.max_rows, head.shape[0], dtype=head.dtype, device=head.device)
        buf = self.logits_out
        return lambda model, inp, cache, one: write_into(buf, prefill_logits(model, inp, cache, one))
