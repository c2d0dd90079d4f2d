"""The ticket the one-launch kernels share (engine/kernels: mla_output, moe_route's one-launch
router, argmax): each program writes its part, then takes a ticket; the program that takes the last
one does the launch's small tail (adds the parts, selects, picks). The ticket decides only who does
the tail, never an order of sums, so the result's bits do not depend on which program came last.
The program doing the tail puts the ticket back to zero, so a CUDA graph replays with no memset."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def last_to_finish(ticket_ptr, programs):
    """True in the one program of `programs` that takes the last ticket. Every thread's stores
    before it are visible to that program (a barrier, then a GPU-scope acquire-release add); it
    reads the others' parts with .cg loads (past its own L1)."""
    tl.debug_barrier()
    return tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu") == programs - 1


def tickets(n: int, device: torch.device | str) -> torch.Tensor:
    """n tickets, zero at rest (every launch leaves them at zero)."""
    return torch.zeros(n, dtype=torch.int32, device=device)
