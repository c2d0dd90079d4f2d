"""The one-launch greedy choice (engine/kernels/argmax.py) on CUDA at lite's vocabulary, skipped
without a GPU: torch.argmax's index for every row (ties across chunks included), the tickets back at
zero, and the same result on each of 300 replays of a CUDA graph.
Run on a GPU machine: pytest tests/engine/test_gpu_argmax.py"""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_argmax_kernel_is_torch_argmax_on_the_gpu():
    from engine.cuda_graphs import capture
    from engine.kernels.argmax import MAX_ROWS, argmax
    from engine.kernels.ticket import tickets
    g = torch.Generator(device="cuda").manual_seed(0)
    ticket = tickets(MAX_ROWS, "cuda")
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
