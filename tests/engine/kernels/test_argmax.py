"""engine/kernels/argmax.py: the one-launch greedy choice is torch.argmax: ties (the first of equal
maxima, across and inside chunks), -inf rows, NaN (the first NaN wins, as in torch), strided rows,
with the tickets back at zero (Triton's CPU interpreter); on the GPU at lite's vocabulary, and the
same result on each of 300 replays of a CUDA graph. Batch invariance: a row's pick, ties included
(the lowest index, as torch.argmax), is the same alone and inside crowds of random rows, where the
kernel and torch agree."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.engine.kernels.config import KernelConfig  # noqa: E402
from tests.engine.kernels.route_crowds import SIZES, crowd  # noqa: E402

ROWS = KernelConfig().argmax_rows  # the tickets the decode step holds


def test_argmax_is_torch_argmax(triton_interpreter, gen):
    from pegainfer.engine.kernels.argmax import argmax
    from pegainfer.engine.kernels.ticket import tickets
    ticket = tickets(ROWS, "cpu")
    x = torch.randn(6, 1000, generator=gen)
    x[1, 10] = x[1, 990] = x[1].max() + 1  # equal maxima in different chunks
    x[2, 500] = x[2, 501] = x[2].max() + 1  # in one chunk
    x[3] = float("-inf")
    x[4, 700] = float("nan")
    x[4, 900] = float("nan")
    x[4, 5] = float("inf")
    wide = torch.randn(3, 1100, generator=gen)[:, :1000]  # strided rows
    for logits in (x, x.to(torch.bfloat16), wide, x[:1]):
        assert torch.equal(argmax(logits, ticket), torch.argmax(logits, dim=-1)), logits.shape
        assert not ticket.any()
    out = torch.full((6,), -1, dtype=torch.int64)
    assert argmax(x, ticket, out=out) is out and torch.equal(out, torch.argmax(x, dim=-1))


def test_gpu_argmax_is_torch_argmax_and_replays_the_same(triton_gpu):
    from pegainfer.engine.cuda_graphs import capture
    from pegainfer.engine.kernels.argmax import argmax
    from pegainfer.engine.kernels.ticket import tickets
    g = torch.Generator(device="cuda").manual_seed(0)
    ticket = tickets(ROWS, "cuda")
    for rows in (1, 3, 64, 256):
        x = torch.randn(rows, 102400, device="cuda", generator=g).to(torch.bfloat16)
        x[0, 7] = x[0, 99000] = 100.0  # equal maxima far apart: the first wins
        assert torch.equal(argmax(x, ticket), torch.argmax(x, dim=-1)), rows
        assert not ticket.any()
        out = torch.empty(rows, dtype=torch.int64, device="cuda")
        graph, _ = capture(lambda: argmax(x, ticket, out=out), None)
        for _ in range(300):
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, torch.argmax(x, dim=-1)) and not ticket.any(), rows


def _tied_rows(v: int, gen: torch.Generator) -> torch.Tensor:
    """[5, V] rows whose maxima tie: far apart, in one chunk, -0.0 before +0.0, every entry equal,
    and many equal bf16 values."""
    x = torch.randn(5, v, generator=gen) - 10
    x[0, [v - 1, 3, v // 2]] = 7.0
    x[1, [41, 40]] = 7.0
    x[2, 30], x[2, 20] = 0.0, -0.0
    x[3] = 1.5
    x[4] = torch.randint(0, 4, (v,), generator=gen).float()  # many equal maxima (3.0)
    return x


def test_ties_pick_the_lowest_index_in_any_crowd(triton_interpreter, gen):
    """Each tied row alone, then all five among random rows at random positions (one program a
    chunk in the interpreter: few rows)."""
    from pegainfer.engine.kernels.argmax import argmax
    from pegainfer.engine.kernels.ticket import tickets
    ticket = tickets(ROWS, "cpu")
    tied = _tied_rows(130, gen)
    want = torch.tensor([3, 40, 20, 0, int(torch.nonzero(tied[4] == 3).min())])
    for dtype in (torch.float32, torch.bfloat16):
        x = tied.to(dtype)
        alone = torch.cat([argmax(x[r:r + 1], ticket) for r in range(5)])
        assert torch.equal(alone, want) and torch.equal(torch.argmax(x, dim=-1), want), dtype
        rows = torch.randn(11, 130, generator=gen).to(dtype)
        where = torch.randperm(11, generator=gen)[:5]
        rows[where] = x
        got = argmax(rows, ticket)
        assert torch.equal(got[where], want) and torch.equal(got, torch.argmax(rows, dim=-1)), dtype
    assert not ticket.any()


def test_gpu_ties_pick_the_lowest_index_in_any_crowd(triton_gpu):
    from pegainfer.engine.kernels.argmax import argmax
    from pegainfer.engine.kernels.ticket import tickets
    g = torch.Generator().manual_seed(0)
    ticket = tickets(ROWS, "cuda")
    tied = _tied_rows(102400, g).to(torch.bfloat16).cuda()
    for r in range(5):
        probe = tied[r:r + 1]
        want = torch.argmax(probe).item()
        assert argmax(probe, ticket).item() == want, r
        for size in SIZES + (1024,):
            rows, pos = crowd(probe, size, g)
            got = argmax(rows, ticket)
            assert got[pos].item() == want and torch.equal(got, torch.argmax(rows, dim=-1)), (r, size)
    assert not ticket.any()
