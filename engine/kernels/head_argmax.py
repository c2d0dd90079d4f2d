"""The LM head and the greedy choice of a one-row decode step in one launch: program j computes the
logits of vocabulary rows [j*BLOCK_N, (j+1)*BLOCK_N) from the final hidden row (float32 sums over K
in BLOCK_K steps, kept in float32 or rounded to the model dtype as F.linear's logits are), keeps
their max and its first index, and the program taking the last ticket (engine/kernels/ticket.py) picks the first block
holding the row's max (both steps are engine/kernels/argmax.py's block_best and first_best):
torch.argmax(F.linear(h, W), -1) without the [V] logits in memory or a second launch. NaN logits
pick the first NaN, as torch does.

The sums run in another order than cuBLAS's GEMV, so a logit can round to the neighbouring bf16
value: where two logits tie within that rounding the pick can differ from F.linear's (as any two
GEMV kernels can); the greedy test on the GPU pins the kernel against the F.linear + argmax path on
weights without such ties. Its tiling and the rows it takes in the decode step: KernelConfig.head and
head_argmax_rows (engine/kernels/config.py). For the same reason it is off in batch-invariant mode
(KernelConfig.on_device sets head_argmax_rows to 0): a row alone would take other logits than the
same row in a crowd."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pegainfer.engine.kernels.argmax import block_best, first_best
from pegainfer.engine.kernels.config import HeadTiling
from pegainfer.engine.kernels.ticket import last_to_finish


@triton.jit
def _head_argmax_kernel(h_ptr, w_ptr, part_v_ptr, part_i_ptr, out_ptr, ticket_ptr, V,
                        K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        N_PROGS: tl.constexpr, N_PROGS_P: tl.constexpr, ROUND: tl.constexpr):
    j = tl.program_id(0)
    n = j * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = n < V
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):  # K % BLOCK_K == 0 (the wrapper checks)
        ks = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * K + ks[None, :], mask=ok[:, None], other=0.0)  # [BN, BK]
        x = tl.load(h_ptr + ks)  # [BK]
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    logit = tl.sum(acc, axis=1)  # [BN]
    if ROUND:  # rounded as model-dtype logits are (KernelConfig.float32_logits off)
        logit = logit.to(h_ptr.dtype.element_ty).to(tl.float32)
    m, first_max, first_nan = block_best(tl.where(ok, logit, float("-inf")), n, ok)
    tl.store(part_v_ptr + j, m)
    tl.store(part_i_ptr + j * 2, first_max)
    tl.store(part_i_ptr + j * 2 + 1, first_nan)
    if last_to_finish(ticket_ptr, N_PROGS):
        tl.store(out_ptr, first_best(part_v_ptr, part_i_ptr, N_PROGS, N_PROGS_P).to(tl.int64))
        tl.store(ticket_ptr, 0)  # every program has taken its ticket: ready for the next launch


def _block_k(k: int, t: HeadTiling) -> int:
    return min(t.block_k, k)


def fits(w: torch.Tensor, tiling: HeadTiling) -> bool:
    """Whether the kernel takes this [V, K] head: contiguous, K a whole number of K blocks."""
    bk = _block_k(w.shape[1], tiling)
    return w.is_contiguous() and w.shape[1] % bk == 0 and bk & (bk - 1) == 0


def head_argmax(h: torch.Tensor, w: torch.Tensor, ticket: torch.Tensor, tiling: HeadTiling,
                out: torch.Tensor | None = None, round_logits: bool = True) -> torch.Tensor:
    """torch.argmax(F.linear(h, w), -1) for one row: h [1, K] (the final norm's output), w [V, K]
    (contiguous); ticket: one of engine/kernels/ticket.py's. Returns [1] int64 (written into `out`
    when given). One launch, graph-safe. round_logits False: the argmax of the float32 sums
    themselves (KernelConfig.float32_logits)."""
    t = tiling
    (rows, k), (v, kw) = h.shape, w.shape
    if rows != 1 or kw != k or not fits(w, t):
        raise ValueError(f"head_argmax takes one row and a contiguous [V, K] head of whole K blocks "
                         f"({_block_k(k, t)}); got h {list(h.shape)}, w {list(w.shape)}")
    n_progs = triton.cdiv(v, t.block_n)
    part_v = torch.empty(n_progs, dtype=torch.float32, device=h.device)  # [P] each block's max
    part_i = torch.empty(n_progs, 2, dtype=torch.int32, device=h.device)  # its first max, its first NaN
    out = torch.empty(1, dtype=torch.int64, device=h.device) if out is None else out
    assert out.shape == (1,) and out.dtype == torch.int64
    _head_argmax_kernel[(n_progs,)](h.contiguous(), w, part_v, part_i, out, ticket, v, K=k, BLOCK_N=t.block_n,
                                    BLOCK_K=_block_k(k, t), N_PROGS=n_progs, N_PROGS_P=triton.next_power_of_2(n_progs),
                                    ROUND=round_logits, num_warps=t.num_warps, num_stages=t.num_stages)
    return out
