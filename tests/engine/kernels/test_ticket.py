"""engine/kernels/ticket.py: the ticket the one-launch kernels share. Of the programs of a launch
exactly one takes the last ticket and does the tail, whatever order they finish in, and it puts the
ticket back to zero, so the next launch (a CUDA graph's replay) needs no memset."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from pegainfer.engine.kernels.ticket import last_to_finish, tickets  # noqa: E402


@triton.jit
def _count_kernel(part_ptr, out_ptr, ticket_ptr, PROGRAMS: tl.constexpr, PROGRAMS_P: tl.constexpr):
    # each program writes its part; the one with the last ticket adds the parts and resets the ticket
    j = tl.program_id(0)
    tl.store(part_ptr + j, j + 1)
    if last_to_finish(ticket_ptr, PROGRAMS):
        k = tl.arange(0, PROGRAMS_P)
        parts = tl.load(part_ptr + k, mask=k < PROGRAMS, other=0, cache_modifier=".cg")
        tl.atomic_add(out_ptr, tl.sum(parts, axis=0))
        tl.atomic_add(out_ptr + 1, 1)  # how many programs did the tail
        tl.store(ticket_ptr, 0)


def _launch(programs: int, ticket: torch.Tensor, device: str) -> torch.Tensor:
    part = torch.zeros(programs, dtype=torch.int32, device=device)
    out = torch.zeros(2, dtype=torch.int32, device=device)
    _count_kernel[(programs,)](part, out, ticket, PROGRAMS=programs, PROGRAMS_P=triton.next_power_of_2(programs))
    return out


def test_tickets_are_zero_at_rest():
    t = tickets(5, "cpu")
    assert t.shape == (5,) and t.dtype == torch.int32 and not t.any()


def test_one_program_does_the_tail_and_resets_the_ticket(triton_interpreter):
    ticket = tickets(1, "cpu")
    for programs in (1, 7, 64):
        for _ in range(2):  # the second launch relies on the first having reset the ticket
            out = _launch(programs, ticket, "cpu")
            assert out.tolist() == [programs * (programs + 1) // 2, 1] and ticket.item() == 0, programs


def test_gpu_one_program_does_the_tail_and_resets_the_ticket(triton_gpu):
    ticket = tickets(1, "cuda")
    for programs in (1, 100, 3000):
        for _ in range(20):
            out = _launch(programs, ticket, "cuda")
            assert out.tolist() == [programs * (programs + 1) // 2, 1] and ticket.item() == 0, programs
