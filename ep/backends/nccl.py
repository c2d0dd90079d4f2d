"""`nccl`: route rows stay on the device. Per MoE layer rank 0 broadcasts a small header (the
per-expert counts every rank needs to size the exchange), then one all-to-all moves the packed rows
(model dtype + float32 weight) out and one moves the float32 results back, on reusable scratch
buffers, split into collectives of at most `chunk_bytes`. One CUDA GPU per rank, or it refuses to
start (ep/nccl_runtime.py names host-staged as the way out). CPU tests run this code over gloo
through the test-only `nccl-over-gloo-test` (ep/backends/nccl_over_gloo_test.py), which says so in
every artifact: NCCL itself never runs on CPU."""
from __future__ import annotations

import dataclasses
import os

import torch

from pegainfer.ep.experts import ExpertShard
from pegainfer.ep.group import RankGroup, Work
from pegainfer.ep.multirank import MultiRankBackend, Spans
from pegainfer.ep.nccl_runtime import check_distinct_gpus, check_nccl_runtime
from pegainfer.ep.ownership import Ownership
from pegainfer.ep.plan import RoutePlan
from pegainfer.ep.rendezvous import ReadyRecord
from pegainfer.ep.scratch import Scratch
from pegainfer.ep.spec import EPSpec
from pegainfer.ep.wire import (
    CMD_RUN,
    CMD_STOP,
    Header,
    chunk_major_order,
    chunk_sizes,
    n_chunks,
    pack_rows,
    row_bytes,
    rows_per_chunk,
    unpack_rows,
)

CHUNK_ENV = "PEGAINFER_EP_CHUNK_BYTES"
DEFAULT_CHUNK_BYTES = 64 << 20


def chunk_bytes_of(spec: EPSpec) -> int:
    """EPSpec.chunk_bytes if set, else $PEGAINFER_EP_CHUNK_BYTES, else 64 MiB."""
    value = spec.chunk_bytes or os.environ.get(CHUNK_ENV) or DEFAULT_CHUNK_BYTES
    value = int(value)
    if value < 1:
        raise ValueError(f"EP chunk size must be a positive number of bytes, got {value}")
    return value


@dataclasses.dataclass(slots=True)
class _Exchange:
    layer: int
    works: list[Work]
    results: torch.Tensor  # [n_remote, H] float32: out[e0:] itself, or chunk-major scratch
    order: torch.Tensor | None  # chunk-major position -> peer-major position (None: identity)


class NcclBackend(MultiRankBackend):
    name = "nccl"
    maturity = "candidate"

    def __init__(self, *args, chunk_bytes: int = DEFAULT_CHUNK_BYTES, **kwargs):
        super().__init__(*args, **kwargs)
        self.chunk_bytes = chunk_bytes
        n = self.cfg.n_routed_experts
        self._header_host = Scratch("cpu", pinned=True)
        self._header = torch.empty(Header.size(n), dtype=torch.int64, device=self.device)
        self._send = Scratch(self.device)  # [n_remote, row_bytes] packed rows, chunk-major
        self._recv = Scratch(self.device)  # [n_remote, H] float32 results, chunk-major
        self._empty_rows = torch.empty(0, row_bytes(self.hidden_size, self.dtype), dtype=torch.uint8, device=self.device)
        self._empty_out = torch.empty(0, self.hidden_size, dtype=torch.float32, device=self.device)

    @classmethod
    def start(cls, spec, cfg, ownership, shard) -> NcclBackend:
        backend = super().start(spec, cfg, ownership, shard)
        backend.chunk_bytes = chunk_bytes_of(spec)
        return backend

    @classmethod
    def pg_backend_for(cls, device: torch.device) -> str:
        return "nccl"  # check_runtime refuses every device but CUDA

    @classmethod
    def device_of(cls, rank: int, device: torch.device, world_size: int) -> torch.device:
        return torch.device("cuda", (device.index or 0) + rank)

    @classmethod
    def check_runtime(cls, device: torch.device, ranks_here: int) -> None:
        check_nccl_runtime(device, ranks_here)

    @classmethod
    def check_rank_runtime(cls, device: torch.device) -> None:
        check_nccl_runtime(device, 1)

    @classmethod
    def vet(cls, records: list[ReadyRecord], device: torch.device) -> str | None:
        if device.type != "cuda":
            return None
        from pegainfer.ep.worker import _gpu_id
        return check_distinct_gpus(records, _gpu_id(device))

    def _remote_sizes(self, counts: list[int]) -> list[int]:
        return _rank_sizes(counts, self.ownership)[1:]

    def _dispatch(self, layer: int, hidden: torch.Tensor, plan: RoutePlan, counts: list[int], spans: Spans) -> _Exchange:
        world, h = self.ownership.world_size, self.hidden_size
        rb = row_bytes(h, hidden.dtype)
        q_in = rows_per_chunk(self.chunk_bytes, rb, world - 1)
        q_out = rows_per_chunk(self.chunk_bytes, h * 4, world - 1)
        header_host = self._header_host.take((Header.size(len(counts)),), torch.int64)
        header_host.copy_(Header(CMD_RUN, layer, q_in, q_out, tuple(counts), sum(counts)).encode(len(counts)))
        self._header.copy_(header_host, non_blocking=True)
        works = [self.group.broadcast(self._header)]
        e0 = spans[0][1]
        sizes = self._remote_sizes(counts)  # routes of ranks 1..N-1
        n_remote = sum(sizes)
        results = self._recv.take((n_remote, h), torch.float32)
        ex = _Exchange(layer, works, results, None)
        if n_remote == 0:
            return ex
        # Dispatch: rows packed chunk by chunk, so that chunk c is one contiguous slice.
        idx = plan.token_index[e0:]  # [n_remote] peer-major
        weight = plan.weight[e0:]
        if n_chunks(sizes, q_in) > 1:
            order_in = torch.tensor(chunk_major_order(sizes, q_in), device=idx.device)
            idx, weight = idx[order_in], weight[order_in]
        packed = pack_rows(self._send.take((n_remote, rb), torch.uint8), hidden[idx], weight)  # [n_remote, rb]
        off = 0
        for c in range(n_chunks(sizes, q_in)):
            cs = chunk_sizes(sizes, q_in, c)
            works.append(self.group.all_to_all(self._empty_rows, packed[off:off + sum(cs)], [0] * world, [0, *cs]))
            off += sum(cs)
        # Combine, posted now so it runs while rank 0 computes its own span.
        if n_chunks(sizes, q_out) > 1:
            ex.order = torch.tensor(chunk_major_order(sizes, q_out), device=idx.device)
        off = 0
        for c in range(n_chunks(sizes, q_out)):
            cs = chunk_sizes(sizes, q_out, c)
            works.append(self.group.all_to_all(results[off:off + sum(cs)], self._empty_out, [0, *cs], [0] * world))
            off += sum(cs)
        return ex

    def _combine(self, ex: _Exchange, out: torch.Tensor) -> None:
        self.group.finish(ex.works, list(range(1, self.ownership.world_size)), f"layer {ex.layer} exchange")
        n_remote = ex.results.shape[0]
        if n_remote == 0:
            return
        tail = out[out.shape[0] - n_remote:]  # [n_remote, H] the peers' spans, rank order
        if ex.order is None:
            tail.copy_(ex.results)
        else:
            tail.index_copy_(0, ex.order, ex.results)

    def _send_stop(self) -> None:
        n = self.cfg.n_routed_experts
        self._header.copy_(Header(CMD_STOP).encode(n))
        self.group.finish([self.group.broadcast(self._header)], list(range(1, self.ownership.world_size)), "stop")
        self.group.settle()

    @classmethod
    def serve(cls, group: RankGroup, shard: ExpertShard, cfg, device: torch.device, dtype: torch.dtype) -> None:
        h, world, me = cfg.hidden_size, group.world_size, group.rank
        ownership = Ownership(cfg.n_routed_experts, world)
        rb = row_bytes(h, dtype)
        kernel = cls.expert_kernel(shard, device)
        header = torch.empty(Header.size(cfg.n_routed_experts), dtype=torch.int64, device=device)
        recv = Scratch(device)
        empty_rows = torch.empty(0, rb, dtype=torch.uint8, device=device)
        empty_out = torch.empty(0, h, dtype=torch.float32, device=device)
        mine = shard.experts
        while True:
            group.broadcast(header).wait()
            hd = Header.decode(header)  # host read: the counts size everything below
            if hd.cmd == CMD_STOP:
                return
            sizes = _rank_sizes(list(hd.counts), ownership)[1:]
            n = sizes[me - 1]
            if sum(sizes) == 0:
                continue
            rows_in = recv.take((n, rb), torch.uint8)
            works, off = [], 0
            for c in range(n_chunks(sizes, hd.rows_per_chunk)):
                k = chunk_sizes(sizes, hd.rows_per_chunk, c)[me - 1]
                works.append(group.all_to_all(rows_in[off:off + k], empty_rows, [k] + [0] * (world - 1), [0] * world))
                off += k
            for w in works:
                w.wait()
            rows, weight = unpack_rows(rows_in, h, dtype)  # [n, H], [n]
            counts = list(hd.counts[mine.start:mine.stop])
            y = shard.run_routes(hd.layer, rows, torch.arange(n, device=device), weight, counts, kernel,
                                 hd.total_routes)  # [n, H] f32
            works, off = [], 0
            for c in range(n_chunks(sizes, hd.out_rows_per_chunk)):
                k = chunk_sizes(sizes, hd.out_rows_per_chunk, c)[me - 1]
                works.append(group.all_to_all(empty_out, y[off:off + k], [0] * world, [k] + [0] * (world - 1)))
                off += k
            for w in works:
                w.wait()


def _rank_sizes(counts: list[int], ownership) -> list[int]:
    """Routes per rank (ownership is contiguous, so each is one span)."""
    return [sum(counts[e.start:e.stop]) for e in (ownership.experts_of(r) for r in range(ownership.world_size))]
