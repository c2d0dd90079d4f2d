"""The batch-invariant linear layer: y = x @ w.T where every output row's bits depend only on that
row of x and on w, never on how many rows share the call, which they are, or where the row sits.

Why a library GEMM is not: it picks its algorithm (GEMV or GEMM, split-K or not, the K blocking)
by the row count, and each choice sums a dot product in a different order. Here the row count never
reaches a choice:
- `blocked` (any device, torch): the rows are padded to whole blocks of ROWS and run as one batched
  GEMM of identical [ROWS, K] x [K, N] problems, so every row meets the same algorithm whatever M
  is (checked by tests/engine/kernels/test_linear.py on the CPU's BLAS, float32 and bfloat16);
- the Triton kernel (CUDA, KernelConfig.triton): a fixed K order for every row count (see below,
  where it is defined).

`linear` picks by the KernelConfig: not batch_invariant -> F.linear (the library's fastest)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pegainfer.engine.kernels.config import KernelConfig

ROWS = 16  # rows per block of the torch form


def blocked(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x: [M, K], w: [N, K] -> [M, N] in x's dtype, every row computed as row r of a [ROWS, K] block."""
    m, k = x.shape
    pad = -m % ROWS
    if pad:
        x = torch.cat([x, x.new_zeros(pad, k)])
    n_blocks = x.shape[0] // ROWS
    out = torch.bmm(x.view(n_blocks, ROWS, k), w.t().unsqueeze(0).expand(n_blocks, -1, -1))  # [n, ROWS, N]
    return out.view(n_blocks * ROWS, w.shape[0])[:m]


def linear(x: torch.Tensor, w: torch.Tensor, kernels: KernelConfig) -> torch.Tensor:
    """x: [..., K] -> [..., N]; batch-invariant when kernels.batch_invariant."""
    if not kernels.batch_invariant:
        return F.linear(x, w)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    return blocked(x2, w).view(*lead, w.shape[0])
