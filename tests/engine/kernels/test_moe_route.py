"""engine/kernels/moe_route.py: the decode step's router computes engine.model.router.route followed by
the route plan's per-token sort, for every selection method; with an Alignment it also lists each
expert's routes (stable, at a fixed stride), its count, its slot among the active experts and the
running totals, with and without the ticket of the one-launch form (up to 16 tokens; the ticket back
at zero). Triton's CPU interpreter, float32; on the GPU at lite's gate shape the one-launch form
against the two-launch form, and the same result on each of 300 CUDA-graph replays."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.engine.model.router import route  # noqa: E402
from pegainfer.ep.plan import RoutePlan  # noqa: E402

H, E, K = 48, 16, 4
GROUPED = dict(method="group_limited_greedy", n_group=4, topk_group=2)


def _sorted_route(x, gate, k, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """route() with each token's routes in ascending expert order, as the kernel writes them."""
    w_ref, e_ref = route(x, gate, top_k=k, **kw)
    e_ref, idx = e_ref.sort(dim=-1)
    return w_ref.gather(1, idx), e_ref


@pytest.mark.parametrize("kw", [dict(), dict(norm_topk_prob=True, scaling=2.5), dict(GROUPED, norm_topk_prob=True)])
def test_router_is_route_then_the_per_token_sort(triton_interpreter, gen, kw):
    from pegainfer.engine.kernels.moe_route import fused_route
    x = torch.randn(5, H, generator=gen)
    gate = torch.randn(E, H, generator=gen)
    w_ref, e_ref = _sorted_route(x, gate, K, **kw)
    w, e = fused_route(x, gate, top_k=K, **kw)
    assert torch.equal(e.long(), e_ref), (kw, e, e_ref)
    assert torch.allclose(w, w_ref, atol=1e-6), (kw, (w - w_ref).abs().max())
    if kw.get("method"):  # the routes stay inside the two best groups of each token
        assert all(len(set((row // 4).tolist())) <= 2 for row in e)


def test_listing_by_expert_matches_the_plan_and_counts_the_totals(triton_interpreter, gen):
    from pegainfer.engine.kernels.moe_experts import Alignment
    from pegainfer.engine.kernels.moe_route import fused_route
    x = torch.randn(5, H, generator=gen)
    gate = torch.randn(E, H, generator=gen)
    w, e = fused_route(x, gate, top_k=K)
    counts = RoutePlan.build(w, e.long(), E).expert_counts.tolist()
    totals = torch.zeros(E, dtype=torch.int64)
    al = Alignment.empty(5, K, totals)
    w_a, e_a = fused_route(x, gate, top_k=K, aligned=al)
    assert torch.equal(w_a, w) and torch.equal(e_a, e)
    assert totals.tolist() == counts
    fused_route(x, gate, top_k=K, aligned=Alignment.empty(5, K, totals))
    assert totals.tolist() == [2 * c for c in counts]
    with pytest.raises(ValueError, match="made for"):
        fused_route(x[:4], gate, top_k=K, aligned=Alignment.empty(5, K, totals))


# (tokens, k, experts, selection): 20 tokens exercise the multi-warp selection; 17 tokens x 1 route of 64
# experts the per-expert listing form; 10 experts a count that is not a power of two
CASES = [(20, K, E, dict()), (20, K, E, GROUPED), (1, K, E, dict()), (17, 1, 64, dict()), (3, 1, 64, dict()),
         (5, K, E, GROUPED), (6, 3, 10, dict()), (18, 3, 10, dict(norm_topk_prob=True, scaling=2.5))]


@pytest.mark.parametrize("ticket", [False, True], ids=["two-launch", "one-launch"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}x{c[1]}of{c[2]}" for c in CASES])
def test_listing_of_every_shape(triton_interpreter, gen, case, ticket):
    """Without a ticket: logits, then the selection kernel (lists up to 16 tokens, a third launch
    above); with one, up to 16 tokens the one-launch router, whose last program selects and lists."""
    from pegainfer.engine.kernels.moe_experts import Alignment
    from pegainfer.engine.kernels.moe_route import fused_route
    tokens, k, n_exp, kw = case
    gate = torch.randn(n_exp, H, generator=gen)
    xb = torch.randn(tokens, H, generator=gen)
    t = torch.zeros(1, dtype=torch.int32) if ticket else None
    al = Alignment.empty(tokens, k, torch.zeros(n_exp, dtype=torch.int64), t)
    wb, eb = fused_route(xb, gate, top_k=k, aligned=al, **kw)
    assert t is None or t.item() == 0
    w_ref, e_ref = _sorted_route(xb, gate, k, **kw)
    assert torch.equal(eb.long(), e_ref) and torch.allclose(wb, w_ref, atol=1e-6)
    pb = RoutePlan.build(wb, eb.long(), n_exp)
    assert al.counts.tolist() == pb.expert_counts.tolist() == al.totals.tolist()
    assert al.starts.tolist() == [i * tokens for i in range(n_exp)]  # a fixed stride per expert
    flat = eb.reshape(-1)
    for i in range(n_exp):  # expert i's route ids, ascending (stable)
        assert al.order[i * tokens: i * tokens + al.counts[i]].tolist() == torch.nonzero(flat == i).flatten().tolist()
    used = [i for i in range(n_exp) if al.counts[i] > 0]
    if tokens <= 16:  # the compact form lists only the experts with routes, one slot per possible one
        assert al.active.tolist() == used + [-1] * (n_exp - len(used)) and al.slots == min(n_exp, tokens * k)
    else:
        assert al.active.tolist() == list(range(n_exp)) and al.slots == n_exp


def test_gpu_one_launch_router_lists_the_same_routes_as_two_launches(triton_gpu):
    from pegainfer.engine.cuda_graphs import capture
    from pegainfer.engine.kernels.moe_experts import Alignment
    from pegainfer.engine.kernels.moe_route import fused_route
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
