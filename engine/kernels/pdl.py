"""Programmatic dependent launch (PDL; Hopper and later) for the decode step's Triton kernels at one
row. A kernel launched with it is placed on the GPU while the kernel before it in the stream still
runs, as soon as every program of that kernel has passed its own `wait` and `release`d; its programs
then `wait` until the previous kernel has finished and its writes are visible before they touch
memory. At one row a layer is a chain of short kernels, and PDL hides each one's launch behind the
previous one (CUDA graphs keep the programmatic edges).

Measured on the H200 (docs/perf-notes.md row 29): the batch-1 step 2,165 -> 2,116 µs, but batch 8
5,365 -> 5,476 µs, hence MAX_ROWS; prefetching each kernel's weights into L2 before its wait gave
back the whole gain at batch 1 and was dropped.

Each PDL kernel calls `wait`, then `release`, before its first load or store. Releasing after the
wait means a launched kernel's predecessor-but-one has finished. Every launch with `launch_pdl`
must come with GDC=True (`waits` gives both), else it could read what the previous kernel has not
written yet. Without PDL (CPU, the interpreter, older GPUs, more rows) the constexpr GDC is False
and the two calls compile to nothing."""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

MAX_ROWS = 1  # launches of up to this many rows (tokens) use PDL; 0: none (tools/gpu_probe.py --pdl-rows)


@functools.cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def enabled(t: torch.Tensor, rows: int = 1) -> bool:
    """A launch of `rows` rows on t's device uses PDL: a CUDA GPU of compute capability 9.0 or
    later, compiled (not the interpreter), rows <= MAX_ROWS."""
    if rows > MAX_ROWS or not t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return _capable(t.device.index if t.device.index is not None else torch.cuda.current_device())


def waits(t: torch.Tensor, rows: int) -> dict:
    """The launch keywords of a PDL kernel of `rows` rows on t's device: its constexpr GDC and, when
    on, launch_pdl."""
    return {"GDC": True, "launch_pdl": True} if enabled(t, rows) else {"GDC": False}


@triton.jit
def wait(GDC: tl.constexpr):
    """Block until the previous kernel in the stream has finished and its writes are visible."""
    if GDC:
        tl.extra.cuda.gdc_wait()


@triton.jit
def release(GDC: tl.constexpr):
    """Let the next PDL kernel be placed once every program of this one has got here."""
    if GDC:
        tl.extra.cuda.gdc_launch_dependents()
