"""The greedy choice of the decode step in one launch: torch.argmax over each row of the logits
(the first of equal maxima; the first NaN if the row has one, as torch does). Program (row, c)
reduces one column chunk to its max and first index; the last chunk of a row to finish
(engine/kernels/ticket.py) picks the first chunk holding the row's max. Ties go to the lowest index
(torch.argmax's rule; -0.0 and +0.0 tie), and a row's pick reads only that row, by exact
comparisons: the same at every batch size (batch-invariant; tests/engine/kernels/test_argmax.py).
The torch form (engine/sampler.py argmax_rows) took four launches, ~24 µs of a batch-1 step on the
H200 (docs/perf-notes.md row 26). Up to how many rows the decode step uses it: KernelConfig.argmax_rows."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pegainfer.engine.kernels.ticket import last_to_finish

CHUNKS = 64  # column chunks per row: 1,600 columns each at lite's 102,400
BIG = tl.constexpr(2147483647)  # "no such index" (int32)


@triton.jit
def block_best(x, cols, ok):
    """One block of values x [N] at columns cols: its max (NaN left out), the first column holding
    it, and the first NaN's column (BIG if none). Masked-out entries (not ok) never count."""
    nan = (x != x) & ok
    first_nan = tl.min(tl.where(nan, cols, BIG), axis=0)
    m = tl.max(tl.where(nan, float("-inf"), x), axis=0)
    first_max = tl.min(tl.where(ok & (x == m), cols, BIG), axis=0)
    return m, first_max, first_nan


@triton.jit
def first_best(part_v_ptr, part_i_ptr, n_parts, N_P: tl.constexpr):
    """From n_parts blocks' (max, first max, first NaN), read past L1 (the tail of a ticketed launch):
    the first NaN's column if any block holds one, else the first max of the first block holding the
    row's max: torch.argmax's pick."""
    k = tl.arange(0, N_P)
    k_ok = k < n_parts
    ms = tl.load(part_v_ptr + k, mask=k_ok, other=float("-inf"), cache_modifier=".cg")
    idx = tl.load(part_i_ptr + k * 2, mask=k_ok, other=0, cache_modifier=".cg")
    nans = tl.load(part_i_ptr + k * 2 + 1, mask=k_ok, other=BIG, cache_modifier=".cg")
    best = tl.max(ms, axis=0)
    first = tl.min(tl.where(k_ok & (ms == best), k, N_P), axis=0)  # the first block holding it
    pick = tl.sum(tl.where(k == first, idx, 0), axis=0)
    any_nan = tl.min(nans, axis=0)
    return tl.where(any_nan < BIG, any_nan, pick)


@triton.jit
def _argmax_kernel(x_ptr, part_v_ptr, part_i_ptr, out_ptr, ticket_ptr, V, stride, CHUNK: tl.constexpr,
                   N_CHUNKS: tl.constexpr, N_CHUNKS_P: tl.constexpr):
    b = tl.program_id(0)
    c = tl.program_id(1)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    ok = cols < V
    x = tl.load(x_ptr + b * stride + cols, mask=ok, other=float("-inf")).to(tl.float32)
    m, first_max, first_nan = block_best(x, cols, ok)
    part = b * N_CHUNKS + c
    tl.store(part_v_ptr + part, m)
    tl.store(part_i_ptr + part * 2, first_max)
    tl.store(part_i_ptr + part * 2 + 1, first_nan)
    if last_to_finish(ticket_ptr + b, N_CHUNKS):
        row = b * N_CHUNKS
        tl.store(out_ptr + b, first_best(part_v_ptr + row, part_i_ptr + row * 2, N_CHUNKS, N_CHUNKS_P).to(tl.int64))
        tl.store(ticket_ptr + b, 0)  # every chunk has taken its ticket: ready for the next launch


def argmax(logits: torch.Tensor, ticket: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """torch.argmax(logits, dim=-1) for [B, V] logits (rows may be strided), written into `out`
    ([B] int64) when given. ticket: engine/kernels/ticket.py's tickets, one per row. One launch, graph-safe."""
    b, v = logits.shape
    assert logits.stride(1) == 1 and b <= ticket.numel()
    chunk = triton.next_power_of_2(triton.cdiv(v, CHUNKS))
    n_chunks = triton.cdiv(v, chunk)
    part_v = torch.empty(b, n_chunks, dtype=torch.float32, device=logits.device)  # [B, chunks] each chunk's max
    part_i = torch.empty(b, n_chunks, 2, dtype=torch.int32, device=logits.device)  # its first max, its first NaN
    out = torch.empty(b, dtype=torch.int64, device=logits.device) if out is None else out
    assert out.shape == (b,) and out.dtype == torch.int64 and out.is_contiguous()
    _argmax_kernel[(b, n_chunks)](logits, part_v, part_i, out, ticket, v, logits.stride(0), CHUNK=chunk,
                                  N_CHUNKS=n_chunks, N_CHUNKS_P=triton.next_power_of_2(n_chunks), num_warps=4)
    return out
