"""Compiling Triton kernels ahead of their first launch, several at once (issue 28, start-up time).

A kernel compiles on its first launch with a new specialisation, in the launching thread, one after
another: at start-up the device sampler's variants alone took ~118 s of the graph capture on an H100
(docs/perf-notes.md, "Where the start-up time goes"). Most of a compile (MLIR passes, LLVM, ptxas)
runs without the GIL, so threads compile side by side. A launch site takes `warm`, a list: given
one, it records each launch as a `Launch` (the kernel, its grid and its exact arguments, so the
specialisation is the one a real launch will look up) instead of running it; `compile_all` then
compiles the recorded launches in a thread pool with JITFunction.warmup, which compiles into the
kernel's cache without launching. Nothing runs on the device and no bits change: the later real
launch finds the compiled kernel."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, NamedTuple

import torch


class Launch(NamedTuple):
    kernel: Any  # a triton JITFunction
    grid: tuple
    args: tuple
    kwargs: dict


def launcher(kernel, grid: tuple, warm: list[Launch] | None) -> Callable[..., Any]:
    """kernel[grid], or (warm a list) a stand-in that records the launch into warm."""
    if warm is None:
        return kernel[grid]
    return lambda *args, **kwargs: warm.append(Launch(kernel, grid, args, kwargs))


def compile_all(launches: list[Launch], device, threads: int) -> tuple[float, list[str]]:
    """Compile every recorded launch, in up to `threads` threads on `device` (a torch.device).
    Returns (seconds, errors): a launch that fails to compile is reported, not raised (its first real
    launch compiles it again and raises there, where it always did)."""
    start = time.perf_counter()
    errors: list[str] = []

    def one(ln: Launch) -> None:
        try:
            if device.type == "cuda":
                torch.cuda.set_device(device)
            ln.kernel.warmup(*ln.args, grid=ln.grid, **ln.kwargs)
        except Exception as e:  # noqa: BLE001 - reported; the real launch compiles it again
            errors.append(f"{getattr(getattr(ln.kernel, 'fn', ln.kernel), '__name__', ln.kernel)}: {type(e).__name__}: {e}")

    if device.type == "cuda":  # each kernel's per-device cache made here, once: two threads making it
        # at once (a defaultdict's factory) would each keep their own, and one compile would be lost
        for kernel in {id(ln.kernel): ln.kernel for ln in launches}.values():
            caches = getattr(kernel, "device_caches", None)
            if caches is not None:
                caches[device.index if device.index is not None else torch.cuda.current_device()]
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(launches)))) as pool:
        list(pool.map(one, launches))
    return time.perf_counter() - start, errors
