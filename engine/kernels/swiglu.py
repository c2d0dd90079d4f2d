"""SiLU(gate) * up in one launch over the output of a fused gate-and-up projection, rounded as the
two torch ops it replaces: SiLU rounded to the model dtype, then the product rounded."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _swiglu_kernel(gu_ptr, out_ptr, I, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < I
    dtype = out_ptr.dtype.element_ty
    g = tl.load(gu_ptr + row * 2 * I + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * I + I + cols, mask=ok, other=0.0).to(tl.float32)
    s = (g * tl.sigmoid(g)).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * I + cols, (s * u).to(dtype), mask=ok)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [T, 2I] (gate columns then up columns) -> [T, I]."""
    t, two_i = gate_up.shape
    i = two_i // 2
    out = torch.empty(t, i, dtype=gate_up.dtype, device=gate_up.device)
    _swiglu_kernel[(t, triton.cdiv(i, 1024))](gate_up.contiguous(), out, i, BLOCK=1024)
    return out
