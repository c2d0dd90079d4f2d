"""The decode step's linear layers when only a few rows go through them (y = x @ W^T with x
[M, K], M at most MAX_ROWS): every program takes BLOCK_N output columns for all M rows, streams its
[BLOCK_N, K] slice of the weight once, and accumulates in float32. At these sizes a linear layer
is a weight read, and many narrow programs keep more of it in flight than cuBLAS's GEMV tiles did
(tools/kernel_bench.py --gemv compares the two on the GPU)."""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

MAX_ROWS = 64  # above this a linear layer is a GEMM and cuBLAS takes it


@dataclasses.dataclass(frozen=True, slots=True)
class Tiling:
    block_n: int = 16
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 4


TILING = Tiling()


@triton.jit
def _skinny_kernel(x_ptr, w_ptr, y_ptr, M, N, K,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    n_ok, r_ok = n < N, rows < M
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(x_ptr + rows[:, None] * K + ks[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + n[None, :].to(tl.int64) * K + ks[:, None], mask=k_ok[:, None] & n_ok[None, :],
                    other=0.0)  # [BLOCK_K, BLOCK_N]
        acc = tl.dot(x, w, acc)
    tl.store(y_ptr + rows[:, None] * N + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=r_ok[:, None] & n_ok[None, :])


def skinny_linear(x: torch.Tensor, w: torch.Tensor, tiling: Tiling = TILING) -> torch.Tensor:
    """x: [M, K]; w: [N, K] (HF layout). Returns [M, N] in x's dtype. Rows above MAX_ROWS go to
    F.linear."""
    m, k = x.shape
    if m > MAX_ROWS:
        return F.linear(x, w)
    n = w.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _skinny_kernel[(triton.cdiv(n, tiling.block_n),)](
        x.contiguous(), w, y, m, n, k, BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=tiling.block_n,
        BLOCK_K=tiling.block_k, num_warps=tiling.num_warps, num_stages=tiling.num_stages)
    return y
