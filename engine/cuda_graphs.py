"""CUDA graphs for the decode step: one graph per (batch bucket, attention-length bucket, output),
captured on first use into one shared memory pool, replayed with the step's rows copied into static
input buffers. Rows beyond the real batch point at a scratch KV slot and are ignored. The output is
either the greedy token of each row (the fast path) or the [B, V] logits, for steps that sample or
report log-probs; every logits graph writes into one shared buffer, so their number costs no memory."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from engine.batch import RowInput
from engine.decode import DecodeInputs, decode_logits, decode_step
from engine.kv_cache import MLACache
from engine.model import DeepseekV2
from engine.startup_log import log_event

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
MIN_LENGTH_BUCKET = 256


def wait_and_read(t: torch.Tensor, pinned: torch.Tensor | None = None) -> list:
    """Wait for the device with the GIL released, then read t. A plain .tolist() blocks inside the
    device copy while holding the GIL, which would stall the asyncio thread for the whole step.
    pinned: a reusable pinned host buffer of at least t's size and dtype; t is copied into it
    before the wait, so the read afterwards is a host read (the graphs' fixed-size outputs use one;
    without it t is read from the device after the wait)."""
    src = t
    if pinned is not None:
        src = pinned[: t.shape[0]]
        src.copy_(t, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    done.synchronize()
    return src.tolist()


def capture(fn: Callable[[], torch.Tensor], pool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """One warm-up call on a side stream (allocations and kernel selection happen outside the
    capture), then fn captured into a graph in `pool`. Returns the graph and fn's output tensor."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


def bucket(n: int, buckets: tuple[int, ...] | list[int]) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")


class DecodeGraphs:
    def __init__(self, model: DeepseekV2, cache: MLACache, max_batch: int, scratch_slot: int):
        self.model = model
        self.cache = cache
        self.scratch_slot = scratch_slot
        self.batch_buckets = [b for b in BATCH_BUCKETS if b < max_batch] + [max_batch]
        lengths, n = [], MIN_LENGTH_BUCKET
        while n < cache.max_len:
            lengths.append(n)
            n *= 2
        self.length_buckets = lengths + [cache.max_len]
        dev = cache.data.device
        self.host = torch.zeros(4, max_batch, dtype=torch.int64).pin_memory()  # ids, pos, slot, ctx
        self.host_np = self.host.numpy()  # the same memory
        self.host_out = torch.zeros(max_batch, dtype=torch.int64).pin_memory()  # the step's tokens, read back
        self.host_out_np = self.host_out.numpy()
        self.done = torch.cuda.Event()  # recorded after each step's read-back copy
        # per batch bucket: (static inputs, pinned inputs, pinned tokens) views, made once: on the GPU
        # machine's host each torch call (a slice included) costs microseconds on every step
        self.views: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.static = torch.zeros(4, max_batch, dtype=torch.int64, device=dev)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple[int, int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.max_batch = max_batch
        self.logits_out: torch.Tensor | None = None  # [max_batch, V], allocated with the first logits graph

    def run(self, rows: list[RowInput], logits: bool = False):
        """rows: decode rows only (one token each). Returns the greedy tokens (list[int]), or with
        logits=True the graph's static [n, V] logits (the caller copies them before the next replay)."""
        n = len(rows)
        b = bucket(n, self.batch_buckets)
        pos = [r.start_pos for r in rows]
        length = bucket(max(pos) + 1, self.length_buckets)
        # the inputs go through a numpy view of the pinned buffer: the host of the GPU machine
        # spends ~70 µs on each torch op, so per-step torch ops here would cost milliseconds
        h = self.host_np
        h[0, :n] = [r.token_ids[0] for r in rows]
        h[1, :n] = pos
        h[2, :n] = [r.slot for r in rows]
        h[3, :n] = h[1, :n] + 1
        self._pad(h, n, b)
        views = self.views.get(b)
        if views is None:
            views = self.views[b] = (self.static[:, :b], self.host[:, :b], self.host_out[:b])
        static, host, tokens = views
        static.copy_(host, non_blocking=True)
        graph, out = self.graphs.get((b, length, logits)) or self._capture(b, length, logits)
        graph.replay()
        if logits:
            return out[:n]
        tokens.copy_(out, non_blocking=True)  # out: [b], the padded rows' tokens too
        self.done.record()
        self.done.synchronize()  # the GIL is released while it waits
        return self.host_out_np[:n].tolist()

    def _pad(self, h: np.ndarray, n: int, b: int) -> None:
        h[0, n:b] = 0
        h[1, n:b] = 0
        h[2, n:b] = self.scratch_slot
        h[3, n:b] = 1

    def _inputs(self, b: int, length: int) -> DecodeInputs:
        s = self.static
        return DecodeInputs(s[0, :b], s[1, :b], s[2, :b], s[3, :b], length)

    def _capture(self, b: int, length: int, logits: bool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        torch.cuda.current_stream().synchronize()  # the step's host->device copy must land first
        saved = self.static[:, :b].clone()
        self._pad(self.host_np, 0, b)  # warm up on the scratch slot only: real caches stay untouched
        self.static[:, :b].copy_(self.host[:, :b])
        inp = self._inputs(b, length)
        fn = self._logits_fn(b) if logits else decode_step
        graph, out = capture(lambda: fn(self.model, inp, self.cache), self.pool)
        self.static[:, :b].copy_(saved)
        self.graphs[(b, length, logits)] = (graph, out)
        log_event("cuda_graph_captured", batch=b, length=length, logits=logits, graphs=len(self.graphs))
        return graph, out

    def _logits_fn(self, b: int):
        """The decode step that leaves its [b, V] logits in the shared output buffer."""
        if self.logits_out is None:
            head = self.model.lm_head  # [V, H]
            self.logits_out = torch.empty(self.max_batch, head.shape[0], dtype=head.dtype, device=head.device)
        buf = self.logits_out[:b]  # [b, V]
        return lambda model, inp, cache: write_into(buf, decode_logits(model, inp, cache))


@torch.inference_mode()
def write_into(buf: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return buf.copy_(values)
