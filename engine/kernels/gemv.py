"""Split-K matrix-vector products for the decode step's narrow projections at one to a few rows
(y = x @ W^T, x [M, K], W [N, K] in HF layout): program (j, s) reads the [BLOCK_N, K / SPLIT] slice
of W at column block j and K-split s once and writes float32 partial sums, part[s, m, n]. The
caller's next kernel adds the SPLIT partials in order (a fixed order: the result does not depend
on timing) and rounds them to the model dtype, as F.linear's output is. Many small programs keep
more of the weight in flight than a GEMV tile per output block, and the reduction costs no launch
of its own (cuBLAS picks split-K for some of these shapes too, with a separate reduce kernel).

Not in the decode step: on the H200 (2026-12-03, docs/perf-notes.md row 21) o_proj through it at one
row took 5.4 µs against cuBLAS's 6.8 in the step's timeline, but the norm that added the partials
grew by 0.5 µs and the step's span did not move (2,283 -> 2,289 µs); at 4 rows it took 13.5 µs
(the float32 accumulator spills). As the shared experts' down projection at one row (SwiGLU folded
into its input, the partials added in the MoE combine's norm) the step got 185 µs slower (row 23).
tools/dev/gemv_bench.py keeps the comparison runnable."""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

MAX_ROWS = 4  # rows the FMA path keeps in registers; above this the projection is cuBLAS's


@dataclasses.dataclass(frozen=True, slots=True)
class Tiling:
    block_n: int = 32
    block_k: int = 256
    split: int = 4
    num_warps: int = 4
    num_stages: int = 3


TILING = Tiling()
O_PROJ = Tiling(block_n=16, block_k=512, split=2)  # the best of gemv_bench's sweep for o_proj at one row


@triton.jit
def _splitk_kernel(x_ptr, w_ptr, part_ptr, M, N, K, K_PER,
                   ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # ROWS: M padded to a power of two (<= MAX_ROWS); acc [ROWS, BLOCK_N, BLOCK_K] in float32, summed
    # over K once at the end (the K order inside a program is fixed by BLOCK_K)
    j = tl.program_id(0)
    s = tl.program_id(1)
    n = j * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, ROWS)
    n_ok, r_ok = n < N, rows < M
    acc = tl.zeros([ROWS, BLOCK_N, BLOCK_K], tl.float32)
    k_lo = s * K_PER
    for k0 in range(0, K_PER, BLOCK_K):
        ks = k_lo + k0 + tl.arange(0, BLOCK_K)
        k_ok = (ks < K) & (k0 + tl.arange(0, BLOCK_K) < K_PER)
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * K + ks[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0).to(tl.float32)  # [BLOCK_N, BLOCK_K]
        x = tl.load(x_ptr + rows[:, None] * K + ks[None, :], mask=r_ok[:, None] & k_ok[None, :],
                    other=0.0).to(tl.float32)  # [ROWS, BLOCK_K]
        acc += x[:, None, :] * w[None, :, :]
    out = tl.sum(acc, axis=2)  # [ROWS, BLOCK_N]
    tl.store(part_ptr + (s * M + rows[:, None]) * N + n[None, :], out, mask=r_ok[:, None] & n_ok[None, :])


def splitk_parts(x: torch.Tensor, w: torch.Tensor, tiling: Tiling = TILING,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [M, K] (M <= MAX_ROWS); w: [N, K]. Returns the partial sums [split, M, N] float32; their sum
    over dim 0, in order, is x @ w^T."""
    m, k = x.shape
    n = w.shape[0]
    if m > MAX_ROWS:
        raise ValueError(f"splitk_parts takes up to {MAX_ROWS} rows, got {m}")
    split = tiling.split
    k_per = triton.cdiv(triton.cdiv(k, split), tiling.block_k) * tiling.block_k
    parts = out if out is not None else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    _splitk_kernel[(triton.cdiv(n, tiling.block_n), split)](
        x.contiguous(), w, parts, m, n, k, k_per, ROWS=triton.next_power_of_2(m), BLOCK_N=tiling.block_n,
        BLOCK_K=tiling.block_k, num_warps=tiling.num_warps, num_stages=tiling.num_stages)
    return parts

