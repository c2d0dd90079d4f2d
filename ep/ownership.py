"""Which rank owns which routed experts: contiguous blocks, the same on every rank."""
from __future__ import annotations

import dataclasses


class OwnershipError(ValueError):
    """An expert split that cannot work (more ranks than experts, bad rank)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Ownership:
    n_experts: int
    world_size: int

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise OwnershipError(f"ep size must be >= 1, got {self.world_size}")
        if self.world_size > self.n_experts:
            raise OwnershipError(f"ep size {self.world_size} is larger than the {self.n_experts} routed experts: "
                                 f"use --ep-size <= {self.n_experts}")

    def experts_of(self, rank: int) -> range:
        """Experts [lo, hi) owned by `rank`; the first n_experts % world ranks get one extra."""
        if not 0 <= rank < self.world_size:
            raise OwnershipError(f"rank {rank} outside world size {self.world_size}")
        base, extra = divmod(self.n_experts, self.world_size)
        lo = rank * base + min(rank, extra)
        return range(lo, lo + base + (1 if rank < extra else 0))

    def owner_table(self) -> list[int]:
        """owner_table()[expert] = rank."""
        out = [0] * self.n_experts
        for r in range(self.world_size):
            for e in self.experts_of(r):
                out[e] = r
        return out
