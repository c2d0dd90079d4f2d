"""Fixtures of the kernel tests (one file per engine/kernels module): every test that runs a kernel on
CPU tensors takes `triton_interpreter` (tests/conftest.py: Triton's CPU interpreter, set before any
kernel is defined), its GPU variant beside it takes `triton_gpu` (compiled, on CUDA)."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture
def gen() -> torch.Generator:
    """A CPU generator, seeded the same for every test."""
    return torch.Generator().manual_seed(0)


@pytest.fixture
def bf16_as_gpu(triton_interpreter, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter keeps bfloat16 as its uint16 bits and does not support bf16 arithmetic
    (triton-lang/triton#11584: its tl.dot multiplies the bits; "we just don't support it yet"), and
    it narrows float32 to bf16 by truncation where the GPU rounds to nearest even. The kernels widen
    every other bf16 value to float32 before arithmetic; for the rest, do what the GPU does for the
    test's duration: widen tl.dot's operands exactly (bits << 16, so float32 products and
    accumulation) and narrow float32 -> bf16 to nearest even (through torch)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as ti
    dot, cast = ti.InterpreterBuilder.create_dot, ti.InterpreterBuilder.cast_impl

    def widen(t):
        if t.dtype.scalar != tl.bfloat16:
            return t
        return ti.TensorHandle((t.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def narrow(self, src, dst_type):
        if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.bfloat16:
            return cast(self, src, dst_type)
        bits = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16).view(torch.int16).numpy()
        return ti.TensorHandle(bits.view(np.uint16), tl.bfloat16)

    monkeypatch.setattr(ti.InterpreterBuilder, "create_dot", lambda self, a, b, d, *rest: dot(self, widen(a), widen(b), d, *rest))
    monkeypatch.setattr(ti.InterpreterBuilder, "cast_impl", narrow)
