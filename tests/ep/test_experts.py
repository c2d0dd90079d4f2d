"""ep/experts.py: which kernel a shard's experts run (ExpertKernel.choose) and, in batch-invariant mode
(the default), that a route's weighted output is the same bits alone and inside crowds of 1 to 256
random tokens on the per-expert loop (the CPU's kernel, and CUDA's without Triton) in float32 and
bfloat16: each expert's rows through the batch-invariant linear, the SwiGLU elementwise by one code
path. Grouped GEMMs are never chosen there, and a triton kernel never hands off to them."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pegainfer.engine.kernels.config import ExpertTilings
from pegainfer.ep import experts as experts_mod
from pegainfer.ep.experts import ExpertKernel, ExpertShard, _swiglu
from pegainfer.ep.plan import RoutePlan
from tests.engine.kernels.route_crowds import SIZES, crowd, probe_weights, routes_crowd

H, I, E, K = 128, 200, 8, 3  # I: rows of 200 elements end in a scalar tail of torch's vector loops


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _shard(gen: torch.Generator, dtype: torch.dtype, dev="cpu") -> ExpertShard:
    w13 = (torch.randn(E, 2 * I, H, generator=gen) * H ** -0.5).to(dtype).to(dev)
    w2 = (torch.randn(E, H, I, generator=gen) * I ** -0.5).to(dtype).to(dev)
    return ExpertShard(range(E), {0: w13}, {0: w2})


def _probe(shard: ExpertShard, rows, experts, weights, pos: int, kernel: ExpertKernel) -> torch.Tensor:
    """The routes of token `pos`: [k, H] float32."""
    plan = RoutePlan.build(weights, experts, E)
    out = shard.run_routes(0, rows, plan.token_index, plan.weight, plan.expert_counts, kernel)  # [R, H]
    return plan.token_major(out)[pos]


def _assert_loop_is_batch_invariant(gen: torch.Generator, dtype: torch.dtype, dev: str) -> None:
    shard = _shard(gen, dtype, dev)
    kernel = ExpertKernel("loop", ExpertTilings())
    for mine in (torch.tensor([0, 3, 7]), torch.tensor([2, 3, 4])):
        probe = torch.randn(1, H, generator=gen).to(dtype).to(dev)
        mine = mine.to(dev)
        alone = _probe(shard, probe, mine[None], probe_weights(K)[None].to(dev), 0, kernel)
        for size in SIZES + (700,):  # 700 tokens: over 256 rows an expert, past torch's parallel grain
            rows, pos = crowd(probe, size, gen)
            experts, weights = routes_crowd(mine, size, E, pos, gen)
            assert torch.equal(_probe(shard, rows, experts, weights, pos, kernel), alone), (size, pos)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loop_route_is_batch_invariant(gen, dtype):
    _assert_loop_is_batch_invariant(gen, dtype, "cpu")


def test_gpu_loop_route_is_batch_invariant():
    """The loop on CUDA (the expert kernel where Triton does not import): cuBLAS's batched GEMMs of
    fixed 16-row blocks."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    _assert_loop_is_batch_invariant(torch.Generator().manual_seed(0), torch.bfloat16, "cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_of_a_row_does_not_depend_on_the_rows_beside_it(gen, dtype):
    """F.silu's vector body and scalar tail differ in float32 bits, and which elements fall in the
    tail moves with the tensor's size; _swiglu takes one path for every element."""
    x = (torch.randn(1999, 2 * 40, generator=gen) * 4).to(dtype)
    alone = torch.cat([_swiglu(x[r:r + 1]) for r in range(1999)])  # [1999, 40]
    for n in (7, 300, 1999):  # 1999 rows x 40: past the parallel grain, a chunk ends inside a row
        assert torch.equal(_swiglu(x[:n]), alone[:n]), n
    gate, up = x.float().chunk(2, dim=-1)
    assert torch.allclose(_swiglu(x).float(), F.silu(gate) * up, rtol=1e-2 if dtype == torch.bfloat16 else 1e-6)


def test_invariant_mode_never_chooses_grouped_gemms(monkeypatch):
    monkeypatch.setattr(experts_mod, "grouped_mm_available", lambda device: True)
    monkeypatch.setattr(experts_mod, "triton_available", lambda: False)
    cuda, bf16, tilings = torch.device("cuda"), torch.bfloat16, ExpertTilings()
    assert ExpertKernel.choose(cuda, bf16, True, tilings) == ExpertKernel("loop", tilings, True)
    assert ExpertKernel.choose(cuda, bf16, True, tilings, batch_invariant=False) == ExpertKernel("grouped_mm", tilings,
                                                                                                 False)
    monkeypatch.setattr(experts_mod, "triton_available", lambda: True)
    for invariant in (True, False):
        assert ExpertKernel.choose(cuda, bf16, True, tilings, batch_invariant=invariant).name == "triton"
        assert ExpertKernel.choose(torch.device("cpu"), bf16, True, tilings, batch_invariant=invariant).name == "loop"
    shard = ExpertShard(range(1), {0: torch.zeros(1, 4, 3, dtype=bf16)}, {0: torch.zeros(1, 3, 2, dtype=bf16)})
    assert shard.kernel_for(cuda, True, tilings, batch_invariant=False).batch_invariant is False
    assert shard.kernel_for(cuda, True, tilings).batch_invariant  # the default, as KernelConfig's


def test_a_grouped_kernel_asked_for_invariance_runs_the_loop(monkeypatch, gen):
    monkeypatch.setattr(ExpertShard, "_run_grouped", lambda *a, **kw: pytest.fail("grouped GEMMs ran"))
    shard = _shard(gen, torch.float32)
    rows = torch.randn(5, H, generator=gen)
    experts, weights = routes_crowd(torch.tensor([1, 2, 3]), 5, E, 0, gen)
    plan = RoutePlan.build(weights, experts, E)
    got = shard.run_routes(0, rows, plan.token_index, plan.weight, plan.expert_counts, ExpertKernel("grouped_mm"))
    want = shard.run(0, rows, plan.token_index, plan.weight, plan.expert_counts.tolist())
    assert torch.equal(got, want)
    fast = shard.run(0, rows, plan.token_index, plan.weight, plan.expert_counts.tolist(), batch_invariant=False)
    assert torch.allclose(fast, want, rtol=1e-5, atol=1e-6)  # the fast path: F.linear and F.silu
