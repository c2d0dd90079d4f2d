"""Reusable exchange buffers: one allocation per role that grows (by doubling) and is then reused
step after step, on the device or in pinned host memory."""
from __future__ import annotations

import torch


class Scratch:
    """A growable uint8 buffer; `take` returns a typed view of its front."""

    def __init__(self, device: torch.device | str, pinned: bool = False):
        self.device = torch.device(device)
        # Pinned memory needs a CUDA context; on a CPU-only build it is plain host memory.
        self.pinned = pinned and self.device.type == "cpu" and torch.cuda.is_available()
        self._buf = torch.empty(0, dtype=torch.uint8, device=self.device)

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A view of `shape` and `dtype` over the buffer (contents undefined)."""
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * dtype.itemsize
        if nbytes > self._buf.numel():
            size = max(nbytes, 2 * self._buf.numel(), 4096)
            self._buf = torch.empty(size, dtype=torch.uint8, device=self.device, pin_memory=self.pinned)
        return self._buf[:nbytes].view(dtype).view(shape)

    @property
    def capacity(self) -> int:
        return self._buf.numel()
