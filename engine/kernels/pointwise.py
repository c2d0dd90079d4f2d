"""Elementwise functions whose bits do not depend on where an element sits in its tensor.

torch's CPU loops run a vectorised body over most of a tensor and a scalar tail at the end of each
chunk, and for transcendental functions (exp, and through it sigmoid and SiLU) the two paths compute
different bits; the chunks follow the tensor's size and the thread count, so a row's SiLU would
depend on how many rows share the call. `uniform` applies a function through a stride-2 view, where
every element takes the same (scalar) path. CUDA computes every element alike: it is used as is."""
from __future__ import annotations

from collections.abc import Callable

import torch


def uniform(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn(x) with every element on one code path (CPU); fn elementwise. Returns a contiguous tensor."""
    if x.is_cuda:
        return fn(x)
    spread = x.new_empty(*x.shape, 2)  # [..., 2]: x in the first lane, so the view has stride 2
    spread[..., 0] = x
    return fn(spread[..., 0]).contiguous()


def silu(x: torch.Tensor) -> torch.Tensor:
    return uniform(torch.nn.functional.silu, x)


def exp(x: torch.Tensor) -> torch.Tensor:
    return uniform(torch.exp, x)
