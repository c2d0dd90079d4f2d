"""Programmatic dependent launch (PDL; Hopper and later) for the decode step's Triton kernels. A
kernel launched with it is placed on the GPU while the kernel before it in the stream still runs:
as soon as every program of that kernel has passed its own `wait` and `release`d. Its programs then
prefetch into L2 the weights no kernel writes, and `wait` until the previous kernel has finished
and its writes are visible before they read anything it made. At one row a layer is a chain of
short kernels; PDL hides each one's launch and the first reads of its weights behind the previous
one (CUTLASS's weight-prefetch example is the model; CUDA graphs keep the programmatic edges).

Each PDL kernel calls, in order: `prefetch_l2` (optional), `wait`, `release`. Releasing after the
wait means a launched kernel's predecessor-but-one has finished. A kernel must not write before its
wait, and every launch with `launch_pdl` must come with GDC=True (`options` gives both), else it
could read what the previous kernel has not written yet. Without PDL (CPU, the interpreter, older
GPUs, ENABLED False) the constexpr GDC is False and the three calls compile to nothing."""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

ENABLED = True  # tools/gpu_probe.py --pdl 0 for the A/B
PREFETCH = True  # the L2 prefetch of weights before the wait (gpu_probe --pdl-prefetch 0)


@functools.cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def enabled(t: torch.Tensor) -> bool:
    """Launches on t's device use PDL: a CUDA GPU of compute capability 9.0 or later, compiled."""
    if not (ENABLED and t.is_cuda) or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return _capable(t.device.index if t.device.index is not None else torch.cuda.current_device())


def waits(t: torch.Tensor) -> dict:
    """The launch keywords of a PDL kernel on t's device: its constexpr GDC and, when on, launch_pdl."""
    return {"GDC": True, "launch_pdl": True} if enabled(t) else {"GDC": False}


def options(t: torch.Tensor, prefetch: bool = True) -> dict:
    """`waits`, and the constexpr PREFETCH of a kernel that prefetches weights before its wait."""
    w = waits(t)
    return w | {"PREFETCH": w["GDC"] and PREFETCH and prefetch}


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


@triton.jit
def prefetch_rows(base, rows, row_ok, n_cols, COLS_P: tl.constexpr, stride, PREFETCH: tl.constexpr):
    """Ask L2 for the first n_cols elements (COLS_P: a power of two >= n_cols) of each of `rows`
    ([R]; where row_ok) of a row-major matrix at `base` with row stride `stride`: one prefetch per
    128-byte line. Only for memory no kernel of the step writes (weights): it runs before the wait."""
    if PREFETCH:
        step: tl.constexpr = 1024 // base.dtype.element_ty.primitive_bitwidth  # elements per line
        cols = tl.arange(0, (COLS_P + step - 1) // step) * step
        ptrs = base + rows[:, None].to(tl.int64) * stride + cols[None, :]
        ok = row_ok[:, None] & (cols < n_cols)[None, :]
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.b32 $0, 0; }",
            "=r,l,r", [ptrs, ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
