"""CUDA graphs for the decode step: one graph per (batch bucket, attention-length bucket, output),
captured into one shared memory pool before serving (engine.warmup; a key it missed, on first use),
replayed with the step's rows copied into static input buffers (the KV page table is the cache's own
static tensor, engine/kv_cache.py). Rows beyond the real batch point at a scratch KV slot and are
ignored. The output (the graph's kind) is the greedy token of each row ("tokens", the fast path); or
each row's token chosen on the device by engine.device_sampler from its own sampling parameters
("sample", and "sample_lp" with the log-probs: issue 33), written where the greedy tokens go, so an
overlapped step may be fed from either; or the [B, V] logits ("logits", for engine.sampler on the
host: prompt log-prob steps, or the device sampler off), which every logits graph writes into one
shared buffer."""
from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import torch

from pegainfer.engine.batch import RowInput
from pegainfer.engine.device_sampler import DeviceSampler
from pegainfer.engine.kernels.config import KernelConfig
from pegainfer.engine.kv_cache import MLACache
from pegainfer.engine.model.decode import decode_logits, decode_step
from pegainfer.engine.model.inputs import DecodeInputs
from pegainfer.engine.model.model import DeepseekV2
from pegainfer.engine.sampler import Draw
from pegainfer.engine.startup_log import log_event

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896,
                 1024)
MIN_LENGTH_BUCKET = 256


def start_read(t: torch.Tensor, pinned: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event]:
    """Queue t's copy into the pinned host buffer and an event after it; finish_read reads it."""
    src = pinned[: t.shape[0]]
    src.copy_(t, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return src, done


def finish_read(started: tuple[torch.Tensor, torch.cuda.Event]) -> list:
    """Wait for start_read's copy with the GIL released, then read the host buffer."""
    src, done = started
    done.synchronize()
    return src.tolist()


def wait_and_read(t: torch.Tensor, pinned: torch.Tensor | None = None) -> list:
    """Wait for the device with the GIL released, then read t. A plain .tolist() blocks inside the
    device copy while holding the GIL, which would stall the asyncio thread for the whole step.
    pinned: a reusable pinned host buffer of at least t's size and dtype; t is copied into it
    before the wait, so the read afterwards is a host read (the graphs' fixed-size outputs use one;
    without it t is read from the device after the wait)."""
    if pinned is not None:
        return finish_read(start_read(t, pinned))
    done = torch.cuda.Event()
    done.record()
    done.synchronize()
    return t.tolist()


def capture(fn: Callable[[], torch.Tensor], pool, priority: int = KernelConfig().capture_priority
            ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """One warm-up call on a side stream (allocations and kernel selection happen outside the
    capture), then fn captured into a graph in `pool` on a stream of `priority` (lower is higher;
    KernelConfig.capture_priority: the step's main branch, the router's small latency-bound kernels
    and then the routed experts, is scheduled ahead of the shared experts' GEMVs on the model's side
    stream, priority 0). Returns the graph and fn's output tensor."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=torch.cuda.Stream(priority=priority)):
        out = fn()
    return graph, out


def bucket(n: int, buckets: tuple[int, ...] | list[int]) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")


SAMPLERS = ("auto", "kernel", "reference", "off")  # DecodeGraphs' `sampler`


class Launched:
    """A decode step on its way: which pinned buffer its tokens land in, how many rows, its kind, and
    the draws that failed on their own values (device-sampled steps)."""
    __slots__ = ("turn", "n", "kind", "failed")

    def __init__(self, turn: int, n: int, kind: str = "tokens", failed: dict[int, str] | None = None):
        self.turn, self.n, self.kind, self.failed = turn, n, kind, failed or {}


class EagerGraph:
    """Off CUDA: the step function itself, run on every replay (the same buffers, no capture), so the
    graphs' inputs, feed and outputs are exercised on the CPU too."""

    def __init__(self, fn: Callable[[], torch.Tensor]):
        self.fn = fn

    def replay(self) -> None:
        self.fn()


class DecodeGraphs:
    def __init__(self, model: DeepseekV2, cache: MLACache, max_batch: int, scratch_slot: int, *,
                 sampler: str = "auto"):
        """sampler: how sampled rows choose their tokens: "auto" (the Triton kernel inside the graph on
        CUDA, engine.sampler on the same device state elsewhere), "kernel", "reference", or "off"
        (the graph returns logits and engine.sampler runs on the host, as before issue 33)."""
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        self.model = model
        self.cache = cache
        self.scratch_slot = scratch_slot
        self.batch_buckets = [b for b in BATCH_BUCKETS if b < max_batch] + [max_batch]
        lengths, n = [], MIN_LENGTH_BUCKET
        while n < cache.max_len:
            lengths.append(n)
            n *= 2
        self.length_buckets = lengths + [cache.max_len]
        attn = model.layers[0].attn
        if attn.fused_decode and model.kernels.batch_invariant:
            # the fixed plan (engine/kernels/mla_fixed.py) splits each row by its own length only, into a
            # per-step work list the split programs walk to its total: the bound sizes only the buffers
            # (the partials: rows x fixed_splits(max_len), kept out of the KV cache by
            # engine.split_partials), so every bound gives the same bits. One bucket, max_len, instead
            # of one per doubling: the graphs to capture before /ready divide by their number
            self.length_buckets = [cache.max_len]
        dev = cache.data.device
        self.on_cuda = dev.type == "cuda"
        m = self.max_batch = max_batch
        # On the device: the last greedy step's tokens [m] (every greedy graph writes them there), then
        # the step's inputs as one contiguous [5, b] block for batch bucket b: ids, positions, slots,
        # cached lengths and the feed. A row's input id is flat[feed]: m + i is the host's id of row i,
        # j < m is row j's token of the step before (an overlapped step learns its ids on the device).
        # Contiguous blocks keep every host->device copy a plain asynchronous one: a strided copy from
        # the pinned buffer went through a pageable temporary, which waits for the stream to drain
        self.flat = torch.zeros(6 * m, dtype=torch.int64, device=dev)
        self.tokens = self.flat[:m]  # [m]
        self.own_feed = np.arange(m, 2 * m, dtype=np.int64)
        # two sets of pinned host buffers, used in turn: the next step's inputs are written while the
        # previous step's copies may still be queued on the stream
        self.host = [host_buffer((5 * m,), self.on_cuda) for _ in range(2)]
        self.host_out = [host_buffer((m,), self.on_cuda) for _ in range(2)]  # the step's tokens, read back
        self.host_out_np = [h.numpy() for h in self.host_out]
        self.done = [torch.cuda.Event() for _ in range(2)] if self.on_cuda else [None, None]
        self.turn = 0
        self.tokens_fresh = False  # the last step launched was greedy: a feed may read its tokens
        # per (batch bucket, turn): the device input block, the pinned input block (and its numpy
        # view), the tokens and the pinned tokens, made once: on the GPU machine's host each torch call
        # (a slice included) costs microseconds on every step
        self.views: dict[tuple[int, int], tuple] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.on_cuda else None
        self.graphs: dict[tuple[int, int, str], tuple] = {}
        self.logits_out: torch.Tensor | None = None  # [max_batch, V], allocated with the first logits graph
        self.sampler = None if sampler == "off" else DeviceSampler(
            cache.num_slots + 1, model.lm_head.shape[0], m, dev,
            kernel=sampler == "kernel" or (sampler == "auto" and self.on_cuda), tiling=model.kernels.sample)

    def kinds(self) -> tuple[str, ...]:
        """The outputs a step can ask for: the device sampler's two only where it is on."""
        return ("tokens", "logits") if self.sampler is None else ("tokens", "logits", "sample", "sample_lp")

    def keys(self) -> list[tuple[int, int, str]]:
        """Every graph a step can ask for: (batch bucket, attention-length bucket, kind); what
        engine.warmup captures before the server is ready."""
        return [(b, n, kind) for b in self.batch_buckets for n in self.length_buckets for kind in self.kinds()]

    def warm(self, keys: list[tuple[int, int, str]]) -> None:
        """Capture these graphs now (on the scratch slot: no request's KV is touched). The device
        sampler's kernels compile first, in threads side by side (DeviceSampler.precompile)."""
        if self.on_cuda and self.sampler is not None and any(k[2] in ("sample", "sample_lp") for k in keys):
            n, seconds, errors = self.sampler.precompile(self.model.logits_dtype, threads=os.cpu_count() or 1)
            log_event("sampler_precompiled", launches=n, seconds=round(seconds, 1), errors=errors,
                      level="warning" if errors else "info")
        for k in keys:
            if k not in self.graphs:
                self._capture(*k)

    def run(self, rows: list[RowInput], logits: bool = False):
        """rows: decode rows only (one token each). Returns the greedy tokens (list[int]), or with
        logits=True the graph's static [n, V] logits (the caller copies them before the next replay)."""
        if logits:
            return self._replay(rows, None, "logits")
        return self.collect(self.launch(rows))

    def launch(self, rows: list[RowInput], feed: list[int] | None = None, draws: list[Draw] | None = None
               ) -> Launched:
        """Start the step of decode rows and return without waiting for it. feed[i] = j >= 0: row i's
        input is row j's token of the step launched just before (greedy or device-sampled), taken on
        the device; -1 (or no feed): the host's id in rows[i].token_ids. draws: one per row, in order,
        chosen by the device sampler (None: the greedy token)."""
        if draws is None:
            return self._replay(rows, feed, "tokens")
        if self.sampler is None:
            raise RuntimeError("these graphs have no device sampler (sampler='off')")
        lp = any(d.spec.logprobs is not None for d in draws)
        return self._replay(rows, feed, "sample_lp" if lp else "sample", draws)

    def follow(self, at: int, tokens: torch.Tensor) -> None:
        """Put tokens [k] (a prompt step's, launched beside the decode rows) into the last step's token
        buffer from row `at` on, so that the next launch may feed them (a device copy, queued)."""
        self.tokens[at:at + tokens.shape[0]].copy_(tokens, non_blocking=True)
        self.tokens_fresh = True

    def logprobs(self, launched: Launched, draws: list[Draw]) -> tuple[list[float | None], list[tuple]]:
        """A collected device-sampled step's log-probs, per draw (None and () where none were asked)."""
        if launched.kind != "sample_lp":
            return [None] * len(draws), [()] * len(draws)
        return self.sampler.logprobs(launched.turn, draws, launched.failed)

    def collect(self, launched: Launched) -> list[int]:
        """The launched step's tokens; waits for it with the GIL released."""
        done = self.done[launched.turn]
        if done is not None:
            done.synchronize()
        return self.host_out_np[launched.turn][: launched.n].tolist()

    def _replay(self, rows: list[RowInput], feed: list[int] | None, kind: str, draws: list[Draw] | None = None):
        n = len(rows)
        b = bucket(n, self.batch_buckets)
        pos = [r.start_pos for r in rows]
        length = bucket(max(pos) + 1, self.length_buckets)
        turn = self.turn
        self.turn ^= 1
        static, host, h, tokens, host_out = self._views(b, turn)
        # the inputs go through a numpy view of the pinned buffer: the host of the GPU machine
        # spends ~70 µs on each torch op, so per-step torch ops here would cost milliseconds
        h[0, :n] = [r.token_ids[0] for r in rows]
        h[1, :n] = pos
        h[2, :n] = [r.slot for r in rows]
        h[3, :n] = h[1, :n] + 1
        if feed is None:
            h[4, :n] = self.own_feed[:n]
        else:
            if not self.tokens_fresh:
                raise RuntimeError("a decode feed needs the step before to be a greedy graph step")
            f = np.asarray(feed, dtype=np.int64)
            h[4, :n] = np.where(f >= 0, f, self.own_feed[:n])
        self._pad(h, n, b)
        static.copy_(host, non_blocking=True)
        failed = self.sampler.fill(rows, draws, turn, b) if draws is not None else None
        graph, out = self.graphs.get((b, length, kind)) or self._capture(b, length, kind)
        graph.replay()
        self.tokens_fresh = kind != "logits"
        if kind == "logits":
            return out[:n]
        host_out.copy_(tokens, non_blocking=True)  # the padded rows' tokens too
        if kind == "sample_lp":
            self.sampler.read_back(turn)
        done = self.done[turn]
        if done is not None:
            done.record()
        return Launched(turn, n, kind, failed)

    def _views(self, b: int, turn: int) -> tuple:
        views = self.views.get((b, turn))
        if views is None:
            m = self.max_batch
            host = self.host[turn][: 5 * b].view(5, b)
            views = self.views[(b, turn)] = (self.flat[m: m + 5 * b].view(5, b), host, host.numpy(),
                                             self.tokens[:b], self.host_out[turn][:b])
        return views

    def _pad(self, h: np.ndarray, n: int, b: int) -> None:
        h[0, n:b] = 0
        h[1, n:b] = 0
        h[2, n:b] = self.scratch_slot
        h[3, n:b] = 1
        h[4, n:b] = self.own_feed[n:b]

    def _inputs(self, b: int, length: int) -> DecodeInputs:
        """The step's inputs as graph-static tensors: the ids gathered through the feed (one kernel)."""
        s = self._views(b, 0)[0]
        ids = self.flat.index_select(0, s[4])
        return DecodeInputs(ids, s[1], s[2], s[3], length)

    def _capture(self, b: int, length: int, kind: str) -> tuple:
        logits = kind == "logits"
        if logits and self.logits_out is None:
            head = self.model.lm_head  # [V, H]
            self.logits_out = torch.empty(self.max_batch, head.shape[0], dtype=self.model.logits_dtype,
                                          device=head.device)
        out_buf = self.logits_out[:b] if logits else self.tokens[:b]

        def fn() -> torch.Tensor:
            inp = self._inputs(b, length)
            if logits:
                return write_into(out_buf, decode_logits(self.model, inp, self.cache))
            if kind == "tokens":
                return decode_step(self.model, inp, self.cache, out=out_buf)
            return self.sampler.choose(decode_logits(self.model, inp, self.cache), out_buf, kind == "sample_lp")

        if not self.on_cuda:
            self.graphs[(b, length, kind)] = (EagerGraph(fn), out_buf)
            return self.graphs[(b, length, kind)]
        torch.cuda.current_stream().synchronize()  # the step's host->device copy must land first
        saved = self.flat.clone()  # the inputs and the previous step's tokens (a feed may read them)
        # the step's sampling parameters; the warm-up samples the padding rows only (greedy, no
        # history slot: the capture's two runs record nothing)
        saved_params = self.sampler.params.clone() if self.sampler is not None else None
        static, host, h, _, _ = self._views(b, self.turn)
        self._pad(h, 0, b)  # warm up on the scratch slot only: real caches stay untouched
        static.copy_(host)
        if saved_params is not None:
            self.sampler.pad(self.turn, 0, b)
            self.sampler.params.copy_(self.sampler.host[self.turn])
        with self.model.routes.uncounted():  # the warm-up step is no step of the engine's
            graph, out = capture(fn, self.pool, self.model.kernels.capture_priority)
        self.flat.copy_(saved)
        if saved_params is not None:
            self.sampler.params.copy_(saved_params)
        self.graphs[(b, length, kind)] = (graph, out)
        log_event("cuda_graph_captured", batch=b, length=length, kind=kind, graphs=len(self.graphs))
        return graph, out


def host_buffer(shape: tuple[int, ...], pinned: bool) -> torch.Tensor:
    t = torch.zeros(shape, dtype=torch.int64)
    return t.pin_memory() if pinned else t


@torch.inference_mode()
def write_into(buf: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return buf.copy_(values)
