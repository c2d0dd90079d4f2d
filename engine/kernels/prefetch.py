"""Pull a weight into the GPU's L2 cache ahead of its use, from a side stream, while the main
stream runs latency-bound kernels that leave HBM idle (the MLA decode chain at one row). The loads
carry the evict-last policy, so the weights' lines outlast the routed experts' streaming reads
until the kernels that need them read them. What is loaded is summed and compared with a value
no weight sum takes in practice (the store never happens), so the loads are not optimised away."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096  # elements per program: 8 KB of bf16, many small programs on the SMs the main stream leaves free


@triton.jit
def _prefetch_kernel(w_ptr, sink_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(w_ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_last")
    total = tl.sum(x.to(tl.float32), axis=0)
    if total == 3.0e38:  # never in practice: keeps the loads
        tl.store(sink_ptr, total)


def prefetch_l2(weight: torch.Tensor, sink: torch.Tensor) -> None:
    """Load every element of `weight` (contiguous) once with the evict-last L2 policy. sink: a
    float32 scalar tensor the kernel could write (it does not). Graph-safe."""
    assert weight.is_contiguous()
    n = weight.numel()
    _prefetch_kernel[(triton.cdiv(n, BLOCK),)](weight, sink, n, BLOCK=BLOCK, num_warps=4)
