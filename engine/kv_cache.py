"""The MLA KV cache: per layer, per slot, per position, the normalised 512-wide latent and the
64-wide roped shared key (576 values; not full K/V), plus the slot free list."""
from __future__ import annotations

import torch


class CacheFull(RuntimeError):
    pass


class MLACache:
    def __init__(self, num_layers: int, num_slots: int, max_len: int, width: int,
                 device: torch.device | str, dtype: torch.dtype):
        self.max_len = max_len
        self.num_slots = num_slots
        # one extra slot, never allocated: padding rows of a CUDA-graph batch write there
        self.scratch_slot = num_slots
        self.data = torch.zeros(num_layers, num_slots + 1, max_len, width, device=device, dtype=dtype)  # [L, S+1, N, W]
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise CacheFull(f"all {self.num_slots} KV slots are in use")
        return self._free.pop()

    def release(self, slot: int) -> None:
        if slot in self._free or not 0 <= slot < self.num_slots:
            raise ValueError(f"KV slot {slot} released twice or out of range")
        self._free.append(slot)

    def write(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, values: torch.Tensor) -> None:
        """slots, positions: [T]; values: [T, W]."""
        self.data[layer, slots, positions] = values.to(self.data.dtype)

    def read(self, layer: int, slot: int, length: int) -> torch.Tensor:
        return self.data[layer, slot, :length]  # [length, W]

    def read_rows(self, layer: int, slots: torch.Tensor, length: int) -> torch.Tensor:
        return self.data[layer, slots, :length]  # [R, length, W]

    @staticmethod
    def bytes_per_token(num_layers: int, width: int, dtype: torch.dtype) -> int:
        return num_layers * width * torch.empty(0, dtype=dtype).element_size()
