"""engine/kernels/moe_route.py: the decode step's router computes engine.model.router.route followed by
the route plan's per-token sort, for every selection method; with an Alignment it also lists each
expert's routes (stable, at a fixed stride), its count, its slot among the active experts and the
running totals, with and without the ticket of the one-launch form (up to 16 tokens; the ticket back
at zero). Triton's CPU interpreter, float32; on the GPU at lite's gate shape the one-launch form
against the two-launch form, and the same result on each of 300 CUDA-graph replays.

Batch invariance (KernelConfig.batch_invariant, the default): a token's routes and weights are the
same bits alone and inside crowds of 1 to 256 random tokens at a random position, in every form of
the kernel (one launch, two, with and without the listing) and in the reference (CPU, float32 and
bfloat16; the interpreter; the GPU at lite's shape); equal scores go to the lowest expert in both."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.engine.kernels.config import KernelConfig  # noqa: E402
from pegainfer.engine.model.router import route  # noqa: E402
from pegainfer.ep.plan import RoutePlan  # noqa: E402
from tests.engine.kernels.route_crowds import FEW_SIZES, SIZES, crowd  # noqa: E402

H, E, K = 48, 16, 4
GROUPED = dict(method="group_limited_greedy", n_group=4, topk_group=2)


def _sorted_route(x, gate, k, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """route() with each token's routes in ascending expert order, as the kernel writes them."""
    w_ref, e_ref = route(x, gate, top_k=k, **kw)
    e_ref, idx = e_ref.sort(dim=-1)
    return w_ref.gather(1, idx), e_ref


@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "fast"])
@pytest.mark.parametrize("kw", [dict(), dict(norm_topk_prob=True, scaling=2.5), dict(GROUPED, norm_topk_prob=True)])
def test_router_is_route_then_the_per_token_sort(triton_interpreter, gen, kw, invariant):
    from pegainfer.engine.kernels.moe_route import fused_route
    x = torch.randn(5, H, generator=gen)
    gate = torch.randn(E, H, generator=gen)
    kw = dict(kw, kernels=KernelConfig(batch_invariant=invariant))
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
        assert torch.equal(w0, w1), tokens  # batch-invariant: the same logits programs, the same sums
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


# lite's gate (64 experts, 6 routes) and the full V2's group-limited selection over it
LITE_GROUPED = dict(method="group_limited_greedy", n_group=8, topk_group=3, norm_topk_prob=True, scaling=2.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kw", [dict(), LITE_GROUPED], ids=["greedy", "grouped"])
def test_reference_route_is_batch_invariant(gen, dtype, kw):
    """route (the prompt path's gate on every device, the CPU's decode step's) at lite's gate shape."""
    gate = torch.randn(64, 2048, generator=gen) * 0.02
    for _ in range(2):
        probe = torch.randn(1, 2048, generator=gen).to(dtype)
        w1, e1 = route(probe, gate, top_k=6, **kw)
        for size in SIZES:
            rows, pos = crowd(probe, size, gen)
            w, e = route(rows, gate, top_k=6, **kw)
            assert torch.equal(e[pos], e1[0]) and torch.equal(w[pos], w1[0]), (size, pos)


def _forms(tokens: int, n_exp: int, k: int, dev="cpu") -> dict:
    """The router's forms for a step of `tokens`: no listing; the listing (two or three launches);
    the listing with the ticket (one launch up to 16 tokens)."""
    from pegainfer.engine.kernels.moe_experts import Alignment
    from pegainfer.engine.kernels.moe_route import MAX_TOKENS

    def listing(ticket):
        return Alignment.empty(tokens, k, torch.zeros(n_exp, dtype=torch.int64, device=dev), ticket)
    forms = {"plain": None}
    if tokens <= MAX_TOKENS:
        forms["listed"] = listing(None)
        forms["one-launch"] = listing(torch.zeros(1, dtype=torch.int32, device=dev))
    return forms


H_SPLIT = 1024  # above 512: without batch invariance the logits' K blocks differ above 16 tokens
GROUPED8 = dict(method="group_limited_greedy", n_group=4, topk_group=2)


@pytest.mark.parametrize("dtype,n_exp,sizes,kw", [
    (torch.float32, 4, FEW_SIZES, dict(norm_topk_prob=True, scaling=2.5)),
    (torch.bfloat16, 8, FEW_SIZES[:-1], dict(GROUPED8, norm_topk_prob=True))], ids=["f32", "bf16"])
def test_fused_route_is_batch_invariant(bf16_as_gpu, gen, dtype, n_exp, sizes, kw):
    """A token's logits programs and selection are the same at every T and in every form (Triton's
    interpreter runs one program at a time: a few experts, 2 routes, a few sizes)."""
    from pegainfer.engine.kernels.moe_route import fused_route
    gate = torch.randn(n_exp, H_SPLIT, generator=gen) / 16
    probe = torch.randn(1, H_SPLIT, generator=gen).to(dtype)
    alone = [fused_route(probe, gate, top_k=2, aligned=al, **kw) for al in _forms(1, n_exp, 2).values()]
    for w, e in alone[1:]:
        assert torch.equal(w, alone[0][0]) and torch.equal(e, alone[0][1])
    for i, size in enumerate(sizes):
        rows, pos = crowd(probe, size, gen)
        forms = list(_forms(size, n_exp, 2).items())
        name, al = forms[i % len(forms)]
        w, e = fused_route(rows, gate, top_k=2, aligned=al, **kw)
        assert torch.equal(e[pos], alone[0][1][0]) and torch.equal(w[pos], alone[0][0][0]), (size, name)


def test_equal_scores_go_to_the_lowest_expert(triton_interpreter, gen):
    """Every expert's gate row the same but the last, half as large again: the last one leads (its
    logit above the rest) or trails (below) and the others tie. The reference and every form of the
    kernel take the lowest of equal scores, as torch.argmax and the kernel's tl.argmax do."""
    from pegainfer.engine.kernels.moe_route import fused_route
    gate = torch.randn(1, H, generator=gen).repeat(E, 1)
    gate[-1] *= 1.5
    x = torch.randn(6, H, generator=gen)
    lead = (x @ gate[0]) > 0  # [6]: the last expert's logit is the largest
    assert 0 < int(lead.sum()) < 6
    want = torch.tensor([[*range(K - 1), E - 1] if big else list(range(K)) for big in lead.tolist()])
    assert torch.equal(_sorted_route(x, gate, K)[1], want)
    for al in _forms(6, E, K).values():
        assert torch.equal(fused_route(x, gate, top_k=K, aligned=al)[1].long(), want)


def test_gpu_router_is_batch_invariant(triton_gpu):
    """Lite's gate, bf16 tokens: every form alone gives the same bits, and each T from 1 to 1024 in
    each of its forms gives the probe those bits; the reference route (the prompt path's gate) too."""
    from pegainfer.engine.kernels.moe_route import fused_route
    g = torch.Generator().manual_seed(0)
    gate = (torch.randn(64, 2048, generator=g) * 0.02).cuda()
    for kw in (dict(), LITE_GROUPED):
        probe = torch.randn(1, 2048, generator=g).to(torch.bfloat16).cuda()
        alone = [fused_route(probe, gate, top_k=6, aligned=al, **kw) for al in _forms(1, 64, 6, "cuda").values()]
        ref_w, ref_e = route(probe, gate, top_k=6, **kw)
        for w, e in alone[1:]:
            assert torch.equal(w, alone[0][0]) and torch.equal(e, alone[0][1])
        for size in SIZES + (512, 1024, 1500):
            rows, pos = crowd(probe, size, g)
            for name, al in _forms(size, 64, 6, "cuda").items():
                w, e = fused_route(rows, gate, top_k=6, aligned=al, **kw)
                assert torch.equal(e[pos], alone[0][1][0]) and torch.equal(w[pos], alone[0][0][0]), (size, name, kw)
            w, e = route(rows, gate, top_k=6, **kw)
            assert torch.equal(e[pos], ref_e[0]) and torch.equal(w[pos], ref_w[0]), (size, "reference", kw)
