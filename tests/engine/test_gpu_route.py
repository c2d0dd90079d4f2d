"""The one-launch router (engine/kernels/moe_route.py, _route_small_kernel) on CUDA at lite's gate
shape, skipped without a GPU: the same routes, weights and expert listing as the two-launch form
(logits, then the selection kernel) at 1 to 16 tokens, the ticket back at zero, and the same
result on every one of 300 replays of a CUDA graph (whichever program finishes last selects).
Run on a GPU machine: pytest tests/engine/test_gpu_route.py"""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_one_launch_router_lists_the_same_routes_as_two_launches():
    from engine.cuda_graphs import capture
    from engine.kernels.moe_experts import Alignment
    from engine.kernels.moe_route import fused_route
    g = torch.Generator(device="cuda").manual_seed(0)
    gate = torch.randn(64, 2048, device="cuda", generator=g) * 0.02
    ticket = torch.zeros(1, dtype=torch.int32, device="cuda")
    for tokens in (1, 2, 7, 16):
        x = torch.randn(tokens, 2048, device="cuda", generator=g).to(torch.bfloat16)
        results = []
        for t in (None, ticket):
            al = Alignment.empty(tokens, 6, torch.zeros(64, dtype=torch.int64, device="cuda"), t)
            w, e = fused_route(x, gate, top_k=6, aligned=al)
            results.append((w, e, al.order.view(64, tokens), al.counts, al.active[:al.slots], al.totals))
        (w0, e0, o0, c0, a0, t0), (w1, e1, o1, c1, a1, t1) = results
        assert torch.equal(e0, e1) and torch.equal(c0, c1) and torch.equal(a0, a1) and torch.equal(t0, t1), tokens
        assert torch.allclose(w0, w1, rtol=1e-6, atol=0), tokens  # logits: another reduction layout is allowed
        for i in range(64):  # the listed part of each expert's stride
            assert torch.equal(o0[i, :c0[i]], o1[i, :c1[i]]), (tokens, i)
        assert ticket.item() == 0
        al = Alignment.empty(tokens, 6, torch.zeros(64, dtype=torch.int64, device="cuda"), ticket)
        graph, out = capture(lambda: fused_route(x, gate, top_k=6, aligned=al), None)
        for _ in range(300):
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out[1], e1) and ticket.item() == 0, tokens
        assert torch.equal(al.totals, t1 * (300 + 1)), tokens  # the warm-up call (outside the graph) counts too
