"""A step's expert attribution for its record: routes per expert (counted by the model's MoE layers,
engine/model/route_counts.py), routes per rank (the same by expert ownership), and what the EP
backend moved (collective calls, bytes, exchange time)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from pegainfer.engine.model.route_counts import RouteCounts
from pegainfer.ep.backend import ExpertBackend
from pegainfer.ep.ownership import Ownership


@dataclasses.dataclass(slots=True)
class ExchangeCounters:
    """Per-step attribution, taken by the engine after each step."""
    routes_per_rank: list[int]
    routes_per_expert: list[int]
    collective_calls: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    exchange_s: float = 0.0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class StepCounters:
    def __init__(self, routes: RouteCounts, ownership: Ownership, backend: ExpertBackend):
        self.routes = routes
        self.ownership = ownership
        self.backend = backend

    def take(self) -> ExchangeCounters:
        """The counters since the last take (the steps run have finished)."""
        return self._counters(self.routes.take(), self.backend.take_exchange())

    def mark(self) -> Callable[[], ExchangeCounters]:
        """Called right after a step is launched, before it is read back: a function that returns
        that step's counters once the step has finished (called in launch order). What the backend
        moved is complete at launch: a backend that moves rows runs its step on the host's side."""
        read, moved = self.routes.mark(), self.backend.take_exchange()
        return lambda: self._counters(read(), moved)

    def _counters(self, per_expert: list[int], moved) -> ExchangeCounters:
        own = self.ownership
        per_rank = [sum(per_expert[e.start:e.stop]) for e in (own.experts_of(r) for r in range(own.world_size))]
        return ExchangeCounters(per_rank, per_expert, moved.collective_calls, moved.bytes_sent, moved.bytes_received,
                                moved.exchange_s)
