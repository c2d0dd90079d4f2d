"""Weights pulled into the GPU's L2 cache ahead of their use, on a stream of their own: the MLA
chain of a decode layer at one row (prep, split, merge) is bound by latency, not bytes, so HBM idles
for ~11 µs a layer; weights the layer reads next (o_proj, the gate, the shared experts) can stream in
then, and their kernels read them from L2 (shorter latency; the shared experts then no longer
compete with the routed ones for HBM). `prefetch.global.L2` asks the memory system for a 128-byte
line and waits for nothing, so a few programs issue megabytes; nothing is written, so the results
of the step do not change whether a line arrives or not. CUDA only (PTX)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# a decode layer's weights by name (DecoderLayer.decode_weights), in the order of their use
NAMES = ("q_kv_a", "w_uv", "o_proj", "gate", "shared_gate_up", "shared_down")
# which of them to pull, in order; () turns prefetching off
WEIGHTS: tuple[str, ...] = ("o_proj", "gate", "shared_gate_up", "shared_down")
NEXT_WEIGHTS: tuple[str, ...] = ()  # the next layer's, asked for after these (e.g. "q_kv_a")
MAX_ROWS = 1  # decode steps of up to this many rows prefetch (0: never)
PROGRAMS = 32  # programs of one prefetch launch
EVICT_LAST = True  # the lines asked for with the L2::evict_last hint (kept past streaming reads)
LINE = 128  # bytes of an L2 line
BLOCK = 512  # lines a program asks for per step (4 per thread at 4 warps)


@triton.jit
def _prefetch_kernel(src_ptr, n_lines, lines_per_program, EVICT_LAST: tl.constexpr, LINE: tl.constexpr,
                     BLOCK: tl.constexpr):
    # program p asks for lines [p * lines_per_program, (p + 1) * lines_per_program); lines past the
    # end ask for the last line again (harmless)
    first = tl.program_id(0) * lines_per_program
    for i0 in range(0, lines_per_program, BLOCK):
        line = tl.minimum(first + i0 + tl.arange(0, BLOCK), n_lines - 1)  # [BLOCK]
        at = src_ptr + line.to(tl.int64) * LINE
        if EVICT_LAST:
            tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l", [at],
                                      dtype=tl.int32, is_pure=False, pack=1)
        else:
            tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [at], dtype=tl.int32,
                                      is_pure=False, pack=1)


def plan(nbytes: int, programs: int = PROGRAMS) -> tuple[int, int, int]:
    """(lines, programs, lines per program) that cover nbytes: at most `programs`, each a whole
    number of BLOCKs."""
    lines = triton.cdiv(nbytes, LINE)
    per = triton.cdiv(triton.cdiv(lines, max(1, programs)), BLOCK) * BLOCK
    return lines, triton.cdiv(lines, per), per


def prefetch(t: torch.Tensor, programs: int = PROGRAMS, evict_last: bool | None = None):
    """Ask L2 for every line of t (contiguous, CUDA). One launch on the current stream, graph-safe.
    Returns the launched kernel (its .asm holds the PTX)."""
    assert t.is_cuda and t.is_contiguous()
    lines, grid, per = plan(t.numel() * t.element_size(), programs)
    evict_last = EVICT_LAST if evict_last is None else evict_last
    return _prefetch_kernel[(grid,)](t.reshape(-1).view(torch.uint8), lines, per, EVICT_LAST=evict_last, LINE=LINE,
                                     BLOCK=BLOCK, num_warps=4)
