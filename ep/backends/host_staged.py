"""`host-staged`: route rows go device -> reusable pinned host buffer -> gloo send/recv -> host ->
device, point to point between rank 0 and each expert rank that has routes this layer. Works on CPU,
on one GPU shared by several ranks, and across GPUs and hosts; it is the transport oracle."""
from __future__ import annotations

import dataclasses

import torch

from pegainfer.ep.experts import ExpertShard
from pegainfer.ep.group import RankGroup, Work
from pegainfer.ep.multirank import MultiRankBackend, Spans
from pegainfer.ep.plan import RoutePlan
from pegainfer.ep.scratch import Scratch
from pegainfer.ep.wire import CMD_RUN, CMD_STOP, Header, pack_rows, row_bytes, unpack_rows

TAG_HEADER, TAG_ROWS, TAG_OUT = 1, 2, 3


@dataclasses.dataclass(slots=True)
class _Exchange:
    layer: int
    works: list[Work]
    peers: list[int]
    results: torch.Tensor  # [R - r0, H] float32 host buffer the peers' outputs land in
    keep: list[torch.Tensor]  # headers alive until their sends complete


class HostStagedBackend(MultiRankBackend):
    name = "host-staged"
    maturity = "production"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._packed = Scratch(self.device)  # [n, row_bytes] rows packed on the device
        self._send_host = Scratch("cpu", pinned=True)  # the same bytes staged on the host
        self._recv_host = Scratch("cpu", pinned=True)  # [n, H] float32 results from the peers

    @classmethod
    def pg_backend_for(cls, device: torch.device) -> str:
        return "gloo"

    @classmethod
    def device_of(cls, rank: int, device: torch.device, world_size: int) -> torch.device:
        if device.type != "cuda":
            return device
        # Ranks go round-robin over the visible GPUs from rank 0's; several may share one.
        return torch.device("cuda", ((device.index or 0) + rank) % torch.cuda.device_count())

    def _dispatch(self, layer: int, hidden: torch.Tensor, plan: RoutePlan, counts: list[int], spans: Spans) -> _Exchange:
        e0 = spans[0][1]
        n_remote = plan.token_index.shape[0] - e0
        peers = [r for r in range(1, len(spans)) if spans[r][1] > spans[r][0]]
        results = self._recv_host.take((n_remote, self.hidden_size), torch.float32)
        ex = _Exchange(layer, [], peers, results, [])
        if not peers:
            return ex
        rb = row_bytes(self.hidden_size, hidden.dtype)
        rows = hidden[plan.token_index[e0:]]  # [n_remote, H] every remote route's row, peers in rank order
        staged = self._send_host.take((n_remote, rb), torch.uint8)
        if hidden.device.type == "cpu":
            pack_rows(staged, rows, plan.weight[e0:])
        else:  # pack on the device, then one device -> host copy (blocking: gloo reads the bytes next)
            staged.copy_(pack_rows(self._packed.take((n_remote, rb), torch.uint8), rows, plan.weight[e0:]))
        for r in peers:
            s, e = spans[r][0] - e0, spans[r][1] - e0
            experts = self.ownership.experts_of(r)
            header = Header(CMD_RUN, layer, counts=tuple(counts[experts.start:experts.stop]),
                            total_routes=sum(counts)).encode(len(experts))
            ex.keep.append(header)
            ex.works.append(self.group.send(header, r, TAG_HEADER))
            ex.works.append(self.group.send(staged[s:e], r, TAG_ROWS))
            ex.works.append(self.group.recv(results[s:e], r, TAG_OUT))  # lands while rank 0 computes its span
        return ex

    def _combine(self, ex: _Exchange, out: torch.Tensor) -> None:
        if not ex.peers:
            return
        self.group.finish(ex.works, ex.peers, f"layer {ex.layer} exchange")
        n_remote = ex.results.shape[0]
        out[out.shape[0] - n_remote:].copy_(ex.results)  # host -> device

    def _send_stop(self) -> None:
        works, keep = [], []
        for r in range(1, self.ownership.world_size):
            header = Header(CMD_STOP).encode(len(self.ownership.experts_of(r)))
            keep.append(header)
            works.append(self.group.send(header, r, TAG_HEADER))
        self.group.finish(works, list(range(1, self.ownership.world_size)), "stop")

    @classmethod
    def serve(cls, group: RankGroup, shard: ExpertShard, cfg, device: torch.device, dtype: torch.dtype) -> None:
        h = cfg.hidden_size
        rb = row_bytes(h, dtype)
        kernel = cls.expert_kernel(shard, device)
        header = torch.empty(Header.size(len(shard.experts)), dtype=torch.int64)
        recv_host, send_host = Scratch("cpu", pinned=device.type == "cuda"), Scratch("cpu", pinned=device.type == "cuda")
        while True:
            group.recv(header, 0, TAG_HEADER).wait()
            hd = Header.decode(header)
            if hd.cmd == CMD_STOP:
                return
            n = sum(hd.counts)
            staged = recv_host.take((n, rb), torch.uint8)
            group.recv(staged, 0, TAG_ROWS).wait()
            rows, weight = unpack_rows(staged.to(device), h, dtype)  # [n, H], [n]
            y = shard.run_routes(hd.layer, rows, torch.arange(n, device=device), weight, list(hd.counts), kernel,
                                 hd.total_routes)  # [n, H] f32
            result = send_host.take((n, h), torch.float32)
            result.copy_(y)
            group.send(result, 0, TAG_OUT).wait()
