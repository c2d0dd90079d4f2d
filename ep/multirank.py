"""The rank-0 half shared by the backends that move route rows to expert ranks (host-staged, nccl):
start-up, the per-layer skeleton (counts, spans, dispatch, rank 0's own span, combine), what moved,
the failed state and close. A subclass says only how the bytes move. Start-up gets plain data: the
EPSpec and the MoEShape (ep/spec.py), never the engine's own spec or config."""
from __future__ import annotations

import abc
import time
from typing import Any

import torch

from pegainfer.engine.kernels.config import KernelConfig
from pegainfer.ep.backend import BackendCaps, Exchange, ExpertBackend, RankFailure
from pegainfer.ep.experts import ExpertKernel, ExpertShard
from pegainfer.ep.group import RankGroup
from pegainfer.ep.launch import LaunchPlan, launch_group
from pegainfer.ep.ownership import Ownership
from pegainfer.ep.plan import RoutePlan
from pegainfer.ep.rendezvous import ReadyRecord
from pegainfer.ep.spec import EPSpec, MoEShape

Spans = list[tuple[int, int]]  # [start, end) of each rank's routes in execution order


class MultiRankBackend(ExpertBackend):
    def __init__(self, group: RankGroup, shard: ExpertShard, cfg: MoEShape, ownership: Ownership,
                 device: torch.device, dtype: torch.dtype, kernels: KernelConfig = KernelConfig()):
        self.group = group
        self.shard = shard
        self.cfg = cfg
        self.ownership = ownership
        self.device = device
        self.dtype = dtype
        self.hidden_size = cfg.hidden_size
        self.last_moe_layer = cfg.moe_layers[-1]
        # the expert ranks (serve) choose theirs the same way: the Triton MLP wherever it runs
        self.kernel = self.expert_kernel(shard, device, kernels)
        self.caps = BackendCaps(graph_safe=False, expert_kernel=self.kernel.name)  # it reads counts on the host
        self._exchange_s = 0.0

    # ---- what a subclass provides --------------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def pg_backend_for(cls, device: torch.device) -> str:
        """The torch.distributed backend this transport runs over on `device`."""

    @classmethod
    def device_of(cls, rank: int, device: torch.device, world_size: int) -> torch.device:
        """The device a rank spawned by rank 0 (on `device`) runs on."""
        return device

    @classmethod
    def check_runtime(cls, device: torch.device, ranks_here: int) -> None:
        """Refuse, before anything starts, a runtime this transport cannot work on."""

    @classmethod
    def check_rank_runtime(cls, device: torch.device) -> None:
        """The same refusal on an expert rank started on another host."""

    @classmethod
    def vet(cls, records: list[ReadyRecord], device: torch.device) -> str | None:
        """A reason to refuse the expert ranks as they reported themselves, or None."""
        return None

    @abc.abstractmethod
    def _dispatch(self, layer: int, hidden: torch.Tensor, plan: RoutePlan, counts: list[int], spans: Spans) -> Any:
        """Start moving the remote routes' rows out and their results back; returns what _combine needs."""

    @abc.abstractmethod
    def _combine(self, exchange: Any, out: torch.Tensor) -> None:
        """Finish the exchange: remote results into out[spans[0][1]:] ([R, H] float32)."""

    @abc.abstractmethod
    def _send_stop(self) -> None:
        """Tell every expert rank to exit its serve loop."""

    @classmethod
    @abc.abstractmethod
    def serve(cls, group: RankGroup, shard: ExpertShard, cfg, device: torch.device, dtype: torch.dtype) -> None:
        """An expert rank's loop: receive rows, run ExpertShard.run, send results, until stop."""

    @staticmethod
    def expert_kernel(shard: ExpertShard, device: torch.device, kernels: KernelConfig = KernelConfig()) -> ExpertKernel:
        """The kernel of every rank's experts: the Triton MLP wherever it runs, whatever
        kernels.triton (which selects rank 0's decode kernels); tilings from `kernels` (an expert
        rank's: the defaults). Always the batch-invariant form, on rank 0 too, whatever
        kernels.batch_invariant: every rank must choose alike, and an expert rank is not told the
        opt-out (--no-batch-invariant changes rank 0's own layers only)."""
        return shard.kernel_for(device, True, kernels.experts)

    # ---- the contract ---------------------------------------------------------------------------
    @classmethod
    def start(cls, spec: EPSpec, cfg: MoEShape, ownership: Ownership, shard: ExpertShard) -> MultiRankBackend:
        device, world = torch.device(spec.device), ownership.world_size
        cls.check_runtime(device, world if spec.spawn else 1)
        plan = LaunchPlan.from_spec(spec, world, cls.pg_backend_for(device))
        group = launch_group(spec, plan, lambda r: cls.device_of(r, device, world), lambda recs: cls.vet(recs, device))
        return cls(group, shard, cfg, ownership, device, getattr(torch, spec.dtype), spec.kernels)

    def expert_outputs(self, layer: int, hidden: torch.Tensor, plan: RoutePlan) -> torch.Tensor:
        """hidden: [T, H] -> [R, H] float32, execution order: rank 0's span computed here, the rest
        by their owners, in the same ExpertShard code (so the bits equal `local`)."""
        self.group.check()  # a failed group stays failed: raise at once
        self.group.settle()  # earlier device-side exchanges must be complete before the host reads counts
        t0 = time.perf_counter()
        counts = plan.expert_counts.tolist()  # [E] the one host read routing needs
        spans = [plan.span(self.ownership.experts_of(r), counts) for r in range(self.ownership.world_size)]
        out = torch.empty(plan.token_index.shape[0], self.hidden_size, dtype=torch.float32, device=hidden.device)
        exchange = self._dispatch(layer, hidden, plan, counts, spans)
        t1 = time.perf_counter()
        s0, e0 = spans[0]
        mine = self.shard.experts
        if e0 > s0:
            mine_counts = (plan.expert_counts[mine.start:mine.stop] if self.kernel.name != "loop"
                           else counts[mine.start:mine.stop])
            out[s0:e0] = self.shard.run_routes(layer, hidden, plan.token_index[s0:e0], plan.weight[s0:e0],
                                               mine_counts, self.kernel, plan.token_index.shape[0])  # [r0, H]
        t2 = time.perf_counter()
        self._combine(exchange, out)
        if layer == self.last_moe_layer:
            self.group.settle()  # nothing after the last MoE layer would notice a stalled rank
        self._exchange_s += time.perf_counter() - t0 - (t2 - t1)
        return out

    def check_ranks(self) -> None:
        self.group.check_liveness("while idle")

    def take_exchange(self) -> Exchange:
        traffic = self.group.traffic.take()
        out = Exchange(traffic.calls, traffic.sent, traffic.received, self._exchange_s)
        self._exchange_s = 0.0
        return out

    def close(self) -> None:
        self.group.close(self._send_stop)

    @property
    def failed(self) -> RankFailure | None:
        return self.group.failure
