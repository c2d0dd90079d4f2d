"""KV capacity: how many KV slots fit at start-up (on CUDA the latent cache is sized from the memory
left after the weights, minus a reserve for activations and CUDA graphs, capped by --max-active
when one is given; on the CPU the default is a small fixed number), and the batcher's view of them
while serving (Capacity; SlotCapacity is one slot of max_model_len tokens per sequence, a paged
cache will count pages behind the same interface)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from pegainfer.engine.kv_cache import MLACache
    from pegainfer.engine.sequence import Sequence

CPU_DEFAULT_SLOTS = 8
MAX_AUTO_SLOTS = 256  # the largest CUDA-graph batch bucket
RESERVE_BYTES = 6 << 30  # activations, graph pools, the packed-prefill masks
USABLE_FRACTION = 0.9


class CapacityError(ValueError):
    """Not even one request of the configured context fits in memory."""


def slots_that_fit(free_bytes: int, max_len: int, bytes_per_token: int, cap: int | None) -> int:
    """Slots of max_len tokens that fit in free_bytes (one extra scratch slot is kept), <= cap."""
    per_slot = max_len * bytes_per_token
    usable = int(free_bytes * USABLE_FRACTION) - RESERVE_BYTES
    fit = usable // per_slot - 1  # the scratch slot padding rows write to
    if fit < 1:
        raise CapacityError(f"the KV cache for one request of {max_len} tokens needs {per_slot / 2**30:.2f} GiB; "
                            f"{free_bytes / 2**30:.1f} GiB are free after the weights — lower --max-model-len")
    return min(fit, cap if cap is not None else MAX_AUTO_SLOTS)


def kv_slots(device: torch.device, max_len: int, bytes_per_token: int, cap: int | None) -> tuple[int, int | None]:
    """(slots, free bytes seen or None on CPU)."""
    if device.type != "cuda":
        return (cap if cap is not None else CPU_DEFAULT_SLOTS), None
    free, _total = torch.cuda.mem_get_info(device)
    return slots_that_fit(free, max_len, bytes_per_token, cap), free


class Capacity(Protocol):
    """What the batcher asks of the KV cache."""

    def fits(self, seq: Sequence) -> bool:
        """Room for a waiting request: its first sequence and the siblings that will fork from it."""

    def take(self, seq: Sequence) -> None:
        """Give the request's first sequence and its siblings their cache (sets each one's slot)."""

    def release(self, seq: Sequence) -> None:
        """One sequence ended or was dropped: its cache is free again."""

    @property
    def used(self) -> int:
        """Slots held now (the step record's kv_slots_used)."""


class SlotCapacity:
    """One KV slot per sequence, from the cache's free list."""

    def __init__(self, cache: MLACache):
        self.cache = cache

    def fits(self, seq: Sequence) -> bool:
        return self.cache.free_slots > len(seq.forks)

    def take(self, seq: Sequence) -> None:
        for s in (seq, *seq.forks):
            s.slot = self.cache.allocate()

    def release(self, seq: Sequence) -> None:
        self.cache.release(seq.slot)

    @property
    def used(self) -> int:
        return self.cache.num_slots - self.cache.free_slots
