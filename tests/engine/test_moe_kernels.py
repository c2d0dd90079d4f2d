"""The fused MoE kernels of the decode step (router, expert MLP, combine-into-norm, SwiGLU) compute
what the torch path computes, run by Triton's CPU interpreter here; the same code runs compiled on
the GPU. Float32, so the comparison is tight; the kernels' bfloat16 roundings are checked by
comparing with torch ops in bfloat16 (to a rounding step: the interpreter's casts differ)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import torch
import torch.nn.functional as F
from engine.kernels.moe_route import fused_route
from engine.kernels.moe_experts import fused_experts, fused_experts_token_major
from engine.kernels.rmsnorm import moe_rmsnorm
from engine.kernels.swiglu import swiglu
from engine.model import rms_norm
from ep.experts import ExpertShard
from ep.plan import RoutePlan
from ep.router import route
g = torch.Generator().manual_seed(0)
T, H, E, K, I = 5, 48, 16, 4, 40

# the router, every selection method, against ep.router.route with the plan's per-token sort
x = torch.randn(T, H, generator=g)
gate = torch.randn(E, H, generator=g)
for kw in [dict(), dict(norm_topk_prob=True, scaling=2.5),
           dict(method="group_limited_greedy", n_group=4, topk_group=2, norm_topk_prob=True)]:
    w_ref, e_ref = route(x, gate, top_k=K, **kw)
    e_ref, idx = e_ref.sort(dim=-1)
    w_ref = w_ref.gather(1, idx)
    w, e = fused_route(x, gate, top_k=K, **kw)
    assert torch.equal(e.long(), e_ref), (kw, e, e_ref)
    assert torch.allclose(w, w_ref, atol=1e-6), (kw, (w - w_ref).abs().max())
    if kw.get("method"):  # the routes stay inside the two best groups of each token
        assert all(len(set((row // 4).tolist())) <= 2 for row in e)

# the expert MLP, both forms, against ExpertShard.run (the per-expert loop, reference order)
w13 = {0: torch.randn(E, 2 * I, H, generator=g) / 8}
w2 = {0: torch.randn(E, H, I, generator=g) / 8}
shard = ExpertShard(range(E), w13, w2)
w, e = fused_route(x, gate, top_k=K)
plan = RoutePlan.build(w, e.long(), E)
counts = plan.expert_counts.tolist()
want = shard.run(0, x, plan.token_index, plan.weight, counts)  # [R, H] execution order
got = fused_experts(x, w13[0], w2[0], plan.token_index, plan.weight, plan.expert_counts)
assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
# the decode step's form: the router's selection kernel lists the routes by expert (the same expert
# order as the route plan, stable, the active experts in order, totals counted), then the experts
# run token-major; 20 tokens exercise the multi-warp selection
from engine.kernels.moe_experts import Alignment
totals = torch.zeros(E, dtype=torch.int64)
al = Alignment.empty(T, K, totals)
w_a, e_a = fused_route(x, gate, top_k=K, aligned=al)
assert torch.equal(w_a, w) and torch.equal(e_a, e)
slots = fused_experts_token_major(x, w13[0], w2[0], w_a, al)  # [T, K, H]
assert torch.allclose(slots, plan.token_major(want), atol=1e-5), (slots - plan.token_major(want)).abs().max()
assert totals.tolist() == counts
fused_route(x, gate, top_k=K, aligned=Alignment.empty(T, K, totals))
assert totals.tolist() == [2 * c for c in counts]
E64 = 64  # more experts than a step's routes: 17 tokens x 1 route (the per-expert listing form)
gate64 = torch.randn(E64, H, generator=g)
w13_64, w2_64 = torch.randn(E64, 2 * I, H, generator=g) / 8, torch.randn(E64, H, I, generator=g) / 8
shard64 = ExpertShard(range(E64), {0: w13_64}, {0: w2_64})
gate10 = torch.randn(10, H, generator=g)  # a count of experts that is not a power of two
shard10 = ExpertShard(range(10), {0: torch.randn(10, 2 * I, H, generator=g) / 8}, {0: torch.randn(10, H, I, generator=g) / 8})
cases = [(20, K, gate, shard, dict()), (20, K, gate, shard, dict(method="group_limited_greedy", n_group=4, topk_group=2)),
         (1, K, gate, shard, dict()), (17, 1, gate64, shard64, dict()), (3, 1, gate64, shard64, dict()),
         (5, K, gate, shard, dict(method="group_limited_greedy", n_group=4, topk_group=2)),
         (6, 3, gate10, shard10, dict()), (18, 3, gate10, shard10, dict(norm_topk_prob=True, scaling=2.5))]
# each case twice: without a ticket (logits, then the selection kernel) and with one (up to 16
# tokens the one-launch router: its last program selects and lists; the ticket is back at zero)
for (tokens, k, gw, sh, kw), ticket in [(c, t) for c in cases for t in (None, torch.zeros(1, dtype=torch.int32))]:
    n_exp = gw.shape[0]
    xb = torch.randn(tokens, H, generator=g)
    al = Alignment.empty(tokens, k, torch.zeros(n_exp, dtype=torch.int64), ticket)
    wb, eb = fused_route(xb, gw, top_k=k, aligned=al, **kw)
    assert ticket is None or ticket.item() == 0
    w_ref, e_ref = route(xb, gw, top_k=k, **kw)
    e_ref, idx = e_ref.sort(dim=-1)
    assert torch.equal(eb.long(), e_ref) and torch.allclose(wb, w_ref.gather(1, idx), atol=1e-6)
    pb = RoutePlan.build(wb, eb.long(), n_exp)
    assert al.counts.tolist() == pb.expert_counts.tolist() == al.totals.tolist()
    assert al.starts.tolist() == [i * tokens for i in range(n_exp)]  # a fixed stride per expert
    flat = eb.reshape(-1)
    for i in range(n_exp):  # expert i's route ids, ascending (stable)
        assert al.order[i * tokens: i * tokens + al.counts[i]].tolist() == torch.nonzero(flat == i).flatten().tolist()
    used = [i for i in range(n_exp) if al.counts[i] > 0]
    if tokens <= 16:  # the one-launch form lists only the experts with routes, one slot per possible one
        assert al.active.tolist() == used + [-1] * (n_exp - len(used)) and al.slots == min(n_exp, tokens * k)
    else:
        assert al.active.tolist() == list(range(n_exp)) and al.slots == n_exp
    got_b = fused_experts_token_major(xb, sh.w13[0], sh.w2[0], wb, al)
    want_b = sh.run(0, xb, pb.token_index, pb.weight, pb.expert_counts.tolist())
    assert torch.allclose(got_b, pb.token_major(want_b), atol=1e-5)

# a shard's routes as a multi-rank backend hands them over: rows arrive already gathered
sub = range(4, 12)
lo, hi = plan.span(sub, counts)
shard_b = ExpertShard(sub, {0: w13[0][4:12]}, {0: w2[0][4:12]})
rows = x[plan.token_index[lo:hi]]
got = fused_experts(rows, shard_b.w13[0], shard_b.w2[0], torch.arange(hi - lo), plan.weight[lo:hi],
                    plan.expert_counts[4:12])
assert torch.allclose(got, want[lo:hi], atol=1e-5)

# the prefill combine kernel: the CPU path's slot order, so the same bits
from engine.kernels.moe_combine import combine_routes, weigh
contrib = torch.randn(T * K, H, generator=g)
assert torch.equal(combine_routes(contrib, plan.perm, K), plan.combine(contrib))
yb = torch.randn(T * K, H, generator=g).bfloat16()
assert torch.equal(weigh(yb, plan.weight), yb * plan.weight[:, None])

# combine folded into the next norm
shared = torch.randn(T, H, generator=g)
resid = torch.randn(T, H, generator=g)
nw = 1 + 0.1 * torch.randn(H, generator=g)
out, res = moe_rmsnorm(slots, shared, nw, 1e-6, residual=resid)
delta = plan.combine(want) + shared
assert torch.allclose(res, resid + delta, atol=1e-5)
assert torch.allclose(out, rms_norm(resid + delta, nw, 1e-6), atol=1e-5)

# SwiGLU; in bfloat16 within a rounding step of the torch ops (the interpreter's bfloat16 casts
# do not round as the GPU's do, so bit equality is checked on the GPU by tools/gpu_probe.py --diag)
gu = torch.randn(T, 2 * I, generator=g)
assert torch.allclose(swiglu(gu), F.silu(gu[:, :I]) * gu[:, I:], atol=1e-6)
gb = gu.bfloat16()
want_b = (F.silu(gb[:, :I]) * gb[:, I:]).float()
assert ((swiglu(gb).float() - want_b).abs() <= want_b.abs() / 64 + 1e-3).all()

# a dense MLP's gate and up with SwiGLU in one launch, as one expert holding every row
from engine.kernels.moe_experts import DenseRows, Tiling, dense_swiglu
gate_up = torch.randn(2 * I, H, generator=g)
rows = DenseRows()
for t in (1, 5):
    want_d = F.silu(x[:t] @ gate_up[:I].T) * (x[:t] @ gate_up[I:].T)
    got_d = dense_swiglu(x[:t], gate_up, rows(t, x.device), Tiling(block_m=16, up_n=16, block_k=32))
    assert torch.allclose(got_d, want_d, atol=1e-4), (got_d - want_d).abs().max()
    assert rows(t, x.device) is rows(t, x.device)  # made once per row count
print("ok")
"""


def test_moe_kernels_match_torch_in_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]


def test_local_backend_hands_steps_above_the_router_limit_to_the_route_plan():
    """A decode step of more tokens than the router lists at once (an explicit --max-active above
    it) runs through the route plan instead of failing."""
    import torch

    from engine.kernels.moe_route import MAX_TOKENS
    from ep.backends.local import LocalBackend
    from ep.experts import ExpertShard
    e, h, i = 4, 8, 6
    shard = ExpertShard(range(e), {0: torch.randn(e, 2 * i, h)}, {0: torch.randn(e, h, i)})
    backend = LocalBackend(shard, e, torch.device("cpu"))
    backend.kernel = "triton"  # as chosen on CUDA bf16
    assert backend.alignment(MAX_TOKENS, 2) is not None
    assert backend.alignment(MAX_TOKENS + 1, 2) is None
