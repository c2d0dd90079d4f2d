"""The batch-invariant linear layer: y = x @ w.T where every output row's bits depend only on that
row of x and on w, never on how many rows share the call, which they are, or where the row sits.

Why a library GEMM is not: it picks its algorithm (GEMV or GEMM, split-K or not, the K blocking)
by the row count, and each choice sums a dot product in a different order. Here the row count never
reaches a choice:
- `blocked` (any device, torch): the rows are padded to whole blocks of ROWS and run as one batched
  GEMM of identical [ROWS, K] x [K, N] problems, so every row meets the same algorithm whatever M
  is (checked by tests/engine/kernels/test_linear.py on the CPU's BLAS, float32 and bfloat16);
- `triton_linear` (CUDA, KernelConfig.triton): every element is summed in one order fixed by K and
  the LinearTiling (engine/kernels/config.py) alone. tl.dot on blocks of block_m rows (rows never
  mix: a row's sums are the same in any block) walks K in order in block_k steps into a float32
  sum per k_chunk; the chunks' sums are added in order to a float32 total, rounded once to x's
  dtype. Per call, from the shape only, `plan` picks the column block (no element's order depends
  on it) and where the chunks run: all in one program (the total kept in registers), or one
  program each, writing float32 parts [chunks, M, N] that `_sum_kernel` adds in chunk order. Both
  make the same additions in the same order (0 + c0 + c1 + ...), so a one-row decode step can
  spread its weight read over every SM (split) while a prompt's many rows keep one launch and no
  parts (whole), and the two give the same bits. With LinearTiling.ticket the split needs no
  second launch: each program, its part written, takes a ticket from its tile's counter (one
  atomic add, the only atomic: it sums nothing), and the program that draws the last ticket adds
  the tile's parts in chunk order and puts the counter back to 0. Which program that is changes
  nothing: the order of the additions is the chunks'. No host synchronisation: CUDA-graph
  capturable.

`linear` picks by the KernelConfig: not batch_invariant -> F.linear (the library's fastest); on
CUDA with the Triton kernels -> triton_linear; else `blocked`."""
from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F

from pegainfer.engine.kernels.config import KernelConfig, LinearTiling

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install where Triton is no dependency: the torch form only
    triton = tl = None

ROWS = 16  # rows per block of the torch form
SUM_BLOCK = 1024  # elements per program of the parts' sum
TICKETS = 1 << 16  # tile counters per device: calls take disjoint runs of them in turn (_Tickets)


def blocked(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x: [M, K], w: [N, K] -> [M, N] in x's dtype, every row computed as row r of a [ROWS, K] block."""
    m, k = x.shape
    pad = -m % ROWS
    if pad:
        x = torch.cat([x, x.new_zeros(pad, k)])
    n_blocks = x.shape[0] // ROWS
    xb, wb = x.view(n_blocks, ROWS, k), w.t().unsqueeze(0).expand(n_blocks, -1, -1)
    if x.is_cuda:
        out = torch.bmm(xb, wb)  # [n, ROWS, N]
    else:
        # one thread: a CPU BLAS given fewer problems than threads may split one problem's K between
        # them (seen with 16 threads on the H200's host), an order that follows the row count
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            out = torch.bmm(xb, wb)  # [n, ROWS, N]
        finally:
            torch.set_num_threads(threads)
    return out.view(n_blocks * ROWS, w.shape[0])[:m]


@functools.cache
def _wide(tiling: LinearTiling) -> LinearTiling:
    """The tiling of calls of wide_rows rows or more: wider row blocks (the same bits, LinearTiling)."""
    return dataclasses.replace(tiling, block_m=tiling.wide_block_m, num_warps=tiling.wide_num_warps)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """How one call runs; none of it changes an element's bits (module docstring)."""
    block_n: int
    chunks: int  # K chunks of tiling.k_chunk: cdiv(K, k_chunk), fixed by K
    split: bool  # one program per chunk, float32 parts summed by _sum_kernel; else one program walks all

    def programs(self, m: int, n: int, tiling: LinearTiling) -> int:
        return _cdiv(m, tiling.block_m) * _cdiv(n, self.block_n) * (self.chunks if self.split else 1)


def plan(m: int, n: int, k: int, tiling: LinearTiling) -> Plan:
    """The widest column block that gives `tiling.programs` programs with the chunks in one program
    each; failing that, the chunks split over programs (with the widest column block that reaches
    the target, or the narrowest)."""
    widths = []
    bn = tiling.block_n_max
    while bn >= tiling.block_n_min:
        widths.append(bn)
        bn //= 2
    m_blocks, chunks = _cdiv(m, tiling.block_m), _cdiv(k, tiling.k_chunk)
    for bn in widths:
        if m_blocks * _cdiv(n, bn) >= tiling.programs:
            return Plan(bn, chunks, False)
    if chunks == 1:
        return Plan(widths[-1], 1, False)
    for bn in widths:
        if m_blocks * _cdiv(n, bn) * chunks >= tiling.programs:
            return Plan(bn, chunks, True)
    return Plan(widths[-1], chunks, True)


if triton is not None:
    @triton.jit
    def _linear_kernel(x_ptr, w_ptr, out_ptr, final_ptr, ticket_ptr, M, N, K, M_BLOCKS, K_BLOCKS,
                       CHUNK_BLOCKS: tl.constexpr, PARTIAL: tl.constexpr, TICKET: tl.constexpr,
                       PRECISION: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # program (i, c): row block i % M_BLOCKS (fastest, so the programs running together share a
        # weight tile in L2), column block i // M_BLOCKS; PARTIAL: K chunk c only, its float32 sum
        # to part [c, M, N] (out_ptr), and with TICKET the tile's last program to finish adds the
        # parts in chunk order into final_ptr; else every chunk, the total rounded to out's dtype.
        pid = tl.program_id(0)
        rm = (pid % M_BLOCKS) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = (pid // M_BLOCKS) * BLOCK_N + tl.arange(0, BLOCK_N)
        m_ok, n_ok = rm < M, rn < N
        if PARTIAL:
            kb_lo = tl.program_id(1) * CHUNK_BLOCKS
            kb_hi = tl.minimum(kb_lo + CHUNK_BLOCKS, K_BLOCKS)
        else:
            kb_lo = 0
            kb_hi = K_BLOCKS
        x_rows = x_ptr + rm[:, None].to(tl.int64) * K  # [BM, 1]
        w_cols = w_ptr + rn[None, :].to(tl.int64) * K  # [1, BN]
        total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for kb in range(kb_lo, kb_hi):
            ks = kb * BLOCK_K + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            a = tl.load(x_rows + ks[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)  # [BM, BK]
            b = tl.load(w_cols + ks[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)  # [BK, BN]
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
            # a chunk ends: its sum joins the total (a select, not a branch: one flat loop pipelines)
            end = ((kb + 1) % CHUNK_BLOCKS == 0) | (kb == K_BLOCKS - 1)
            total = tl.where(end, total + acc, total)
            acc = tl.where(end, 0.0, acc)
        ok = m_ok[:, None] & n_ok[None, :]
        if PARTIAL:
            at = rm[:, None].to(tl.int64) * N + rn[None, :]
            tl.store(out_ptr + tl.program_id(1).to(tl.int64) * M * N + at, total, mask=ok)
            if TICKET:
                # every thread's part is written before the ticket (the barrier, then the atomic's
                # release); the last ticket's reads follow its acquire and skip L1 (.cg), which may
                # hold an earlier call's parts
                tl.debug_barrier()
                chunks = tl.num_programs(1)
                drawn = tl.atomic_add(ticket_ptr + pid, 1, sem="acq_rel", scope="gpu")
                if drawn == chunks - 1:
                    total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                    for c in range(0, chunks):
                        total = total + tl.load(out_ptr + c * M * N + at, mask=ok, other=0.0, cache_modifier=".cg")
                    tl.store(final_ptr + at, total.to(final_ptr.dtype.element_ty), mask=ok)
                    tl.atomic_xchg(ticket_ptr + pid, 0, sem="relaxed", scope="gpu")
        else:
            tl.store(out_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], total.to(out_ptr.dtype.element_ty),
                     mask=ok)

    @triton.jit
    def _sum_kernel(part_ptr, out_ptr, MN, CHUNKS, BLOCK: tl.constexpr):
        # out.flat[i] = (0 + part[0].flat[i] + part[1].flat[i] + ...) in chunk order, rounded to out's
        # dtype: the additions the whole-K program makes in registers
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < MN
        src = part_ptr + offs
        total = tl.zeros([BLOCK], tl.float32)
        for _ in range(0, CHUNKS):
            total = total + tl.load(src, mask=ok, other=0.0)
            src += MN
        tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=ok)


class _Tickets:
    """The split's tile counters: TICKETS int32 zeros per device, made on first use, handed out in
    runs of a call's tile count, one run after the other, wrapping at the end. Each call leaves its
    run at zero, and two calls that run at once (the shared experts' stream beside the main one)
    hold different runs unless TICKETS counters were handed out between their launches."""

    def __init__(self):
        self.counters: dict[torch.device, torch.Tensor] = {}
        self.next: dict[torch.device, int] = {}

    def take(self, device: torch.device, tiles: int) -> torch.Tensor | None:
        """A run of `tiles` zeroed counters, or None where tiles exceed TICKETS or the counters
        would be made inside a CUDA graph's capture (then the second launch sums the parts)."""
        buf = self.counters.get(device)
        if buf is None:
            if tiles > TICKETS or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
                return None
            buf = self.counters[device] = torch.zeros(TICKETS, dtype=torch.int32, device=device)
        if tiles > TICKETS:
            return None
        at = self.next.get(device, 0)
        if at + tiles > TICKETS:
            at = 0
        self.next[device] = at + tiles
        return buf[at:at + tiles]


_tickets = _Tickets()


def triton_linear(x: torch.Tensor, w: torch.Tensor, tiling: LinearTiling,
                  out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x: [M, K], w: [N, K] contiguous, both bfloat16 or both float32 (float32 summed exactly:
    tl.dot's "ieee" precision) -> [M, N] in out_dtype (default x's: the float32 total rounded once;
    float32: the total itself), each row's bits independent of M and of the other rows. CUDA tensors
    (CPU ones in Triton's interpreter)."""
    if triton is None:
        raise RuntimeError("triton_linear needs Triton (not installed)")
    m, k = x.shape
    n = w.shape[0]
    if w.shape[1] != k or w.dtype != x.dtype or x.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"triton_linear takes x [M, K] and w [N, K] of one dtype, bfloat16 or float32: "
                         f"x {tuple(x.shape)} {x.dtype}, w {tuple(w.shape)} {w.dtype}")
    if not w.is_contiguous():
        raise ValueError("triton_linear: w must be contiguous (a copy per call would read it twice)")
    out = torch.empty(m, n, dtype=out_dtype or x.dtype, device=x.device)  # [M, N]
    if m == 0 or n == 0:
        return out
    x = x.contiguous()
    if m >= tiling.wide_rows:
        tiling = _wide(tiling)
    p = plan(m, n, k, tiling)
    m_blocks = _cdiv(m, tiling.block_m)
    dst = torch.empty(p.chunks, m, n, dtype=torch.float32, device=x.device) if p.split else out  # [chunks, M, N]
    tiles = m_blocks * _cdiv(n, p.block_n)
    tickets = _tickets.take(x.device, tiles) if p.split and tiling.ticket else None
    _linear_kernel[(tiles, p.chunks if p.split else 1)](
        x, w, dst, out, dst if tickets is None else tickets, m, n, k, m_blocks, _cdiv(k, tiling.block_k),
        CHUNK_BLOCKS=tiling.k_chunk // tiling.block_k, PARTIAL=p.split, TICKET=tickets is not None,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",  # tf32: the default, unused for bf16
        BLOCK_M=tiling.block_m, BLOCK_N=p.block_n, BLOCK_K=tiling.block_k,
        num_warps=tiling.num_warps, num_stages=tiling.num_stages)
    if p.split and tickets is None:
        _sum_kernel[(_cdiv(m * n, SUM_BLOCK),)](dst, out, m * n, p.chunks, BLOCK=SUM_BLOCK)
    return out


def linear(x: torch.Tensor, w: torch.Tensor, kernels: KernelConfig, out_dtype: torch.dtype | None = None
           ) -> torch.Tensor:
    """x: [..., K] -> [..., N]; batch-invariant when kernels.batch_invariant. out_dtype float32 (the LM
    head's logits, KernelConfig.float32_logits): the float32 sums of the products as they are, not
    rounded to x's dtype first (the Triton kernel stores its total, cuBLAS writes float32, the CPU
    forms multiply the operands widened)."""
    wide = out_dtype is not None and out_dtype != x.dtype
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])  # [M, K]
    if x.is_cuda and kernels.triton and kernels.batch_invariant:
        y = triton_linear(x2, w, kernels.linear, out_dtype)
    elif not kernels.batch_invariant:
        if not wide:
            return F.linear(x, w)
        # cuBLAS sums in float32 and writes the sums (torch.mm's out_dtype, CUDA only)
        y = torch.mm(x2, w.t(), out_dtype=out_dtype) if x.is_cuda else F.linear(x2.to(out_dtype), w.to(out_dtype))
    else:
        y = blocked(x2.to(out_dtype), w.to(out_dtype)) if wide else blocked(x2, w)
    return y.view(*lead, w.shape[0])
