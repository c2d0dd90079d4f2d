"""CUDA graphs for the prefill of fresh prompts: one graph per packed-token bucket, captured on first
use into the decode graphs' memory pool. A step's prompts are packed back to back; the tail of the
bucket is padding on the scratch KV slot, each padding token a prompt of its own (position 0). Like the decode
graphs, a bucket has a greedy-token graph and, captured only once a step samples, a logits graph
writing into a buffer all logits graphs share. With KernelConfig.batch_invariant the graphs hold the
Triton `prompt_attention` only; without the Triton kernels such steps run eagerly (fits)."""
from __future__ import annotations

import numpy as np
import torch

from pegainfer.engine.batch import RowInput
from pegainfer.engine.cuda_graphs import bucket, capture, wait_and_read, write_into
from pegainfer.engine.kv_cache import MLACache
from pegainfer.engine.model.inputs import PrefillInputs
from pegainfer.engine.model.model import DeepseekV2
from pegainfer.engine.model.prefill import prefill_logits, prefill_step
from pegainfer.engine.startup_log import log_event

TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 3072, 4096, 5120, 6144, 8192)
MAX_ROWS = 64  # prompts per graphed prefill step; larger steps run eagerly


class PrefillGraphs:
    def __init__(self, model: DeepseekV2, cache: MLACache, pool, max_tokens: int):
        self.model = model
        self.cache = cache
        self.pool = pool
        # a pack is bounded by the step's prefill budget, not by one prompt's length (max_len): many
        # short prompts may fill a bucket longer than any one of them
        self.buckets = [b for b in TOKEN_BUCKETS if b < max_tokens] + [max_tokens]
        self.max_rows = MAX_ROWS
        dev = cache.data.device
        n = self.buckets[-1]
        self.host = torch.zeros(4, n, dtype=torch.int64).pin_memory()  # ids, pos, slot, row
        self.host_last = torch.zeros(self.max_rows, dtype=torch.int64).pin_memory()
        self.host_np, self.host_last_np = self.host.numpy(), self.host_last.numpy()  # the same memory
        self.host_out = torch.zeros(self.max_rows, dtype=torch.int64).pin_memory()
        self.static = torch.zeros(4, n, dtype=torch.int64, device=dev)
        self.static_last = torch.zeros(self.max_rows, dtype=torch.int64, device=dev)
        self.graphs: dict[tuple[int, bool, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}  # (tokens, logits, one prompt)
        self.logits_out: torch.Tensor | None = None  # [max_rows, V], allocated with the first logits graph

    def fits(self, rows: list[RowInput]) -> bool:
        """Whether a graph runs these prompts: fresh ones, few enough, within the largest bucket, and an
        attention that a graph can hold (the batch-invariant torch form reads the prompts on the host)."""
        attn = self.model.layers[0].attn
        if attn.invariant and not attn.fused_prefill:
            return False
        return (len(rows) <= self.max_rows and all(r.start_pos == 0 for r in rows)
                and sum(len(r.token_ids) for r in rows) <= self.buckets[-1])

    def run(self, rows: list[RowInput], logits: bool = False):
        """The greedy token of every prompt (list[int]), or with logits=True the graph's static
        [R, V] logits of their last tokens (the caller copies them before the next replay)."""
        total = sum(len(r.token_ids) for r in rows)
        t = bucket(total, self.buckets)
        ids, pos, slots, row_ids, last = [], [], [], [], []
        for i, r in enumerate(rows):
            ids += r.token_ids
            pos += range(len(r.token_ids))
            slots += [r.slot] * len(r.token_ids)
            row_ids += [i] * len(r.token_ids)
            last.append(len(ids) - 1)
        h = self.host_np  # numpy views: no torch op per input on the host
        h[:, :total] = [ids, pos, slots, row_ids]
        self._pad(total, t)
        self.host_last_np[: len(rows)] = last
        self.host_last_np[len(rows):] = 0
        self.static[:, :t].copy_(self.host[:, :t], non_blocking=True)
        self.static_last.copy_(self.host_last, non_blocking=True)
        one = len(rows) == 1  # one prompt: causal attention without the T x T mask
        graph, out = self.graphs.get((t, logits, one)) or self._capture(t, logits, one)
        graph.replay()
        return out[: len(rows)] if logits else wait_and_read(out[: len(rows)], self.host_out)

    def _pad(self, start: int, end: int) -> None:
        h = self.host_np
        h[0, start:end] = 0
        h[1, start:end] = 0  # position 0: a prompt of one token, which attends to itself only
        h[2, start:end] = self.cache.scratch_slot
        h[3, start:end] = np.arange(self.max_rows, self.max_rows + end - start)

    def _capture(self, t: int, logits: bool, one: bool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        torch.cuda.current_stream().synchronize()  # the step's host->device copies must land first
        saved, saved_last = self.static[:, :t].clone(), self.static_last.clone()
        self._pad(0, t)  # warm up on the scratch slot only
        self.static[:, :t].copy_(self.host[:, :t])
        self.static_last.zero_()
        s = self.static
        inp = PrefillInputs(s[0, :t], s[1, :t], s[2, :t], s[3, :t], self.static_last)
        fn = self._logits_fn() if logits else prefill_step
        with self.model.routes.uncounted():  # the warm-up step is no step of the engine's
            graph, out = capture(lambda: fn(self.model, inp, self.cache, one), self.pool,
                                 self.model.kernels.capture_priority)
        self.static[:, :t].copy_(saved)
        self.static_last.copy_(saved_last)
        self.graphs[(t, logits, one)] = (graph, out)
        log_event("cuda_graph_captured", kind="prefill", tokens=t, logits=logits, one_prompt=one,
                  graphs=len(self.graphs))
        return graph, out

    def _logits_fn(self):
        """The prefill step that leaves its [max_rows, V] logits in the shared output buffer."""
        if self.logits_out is None:
            head = self.model.lm_head  # [V, H]
            self.logits_out = torch.empty(self.max_rows, head.shape[0], dtype=head.dtype, device=head.device)
        buf = self.logits_out
        return lambda model, inp, cache, one: write_into(buf, prefill_logits(model, inp, cache, one))
