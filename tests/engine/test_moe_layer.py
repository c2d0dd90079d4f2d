"""The MoE layer (engine/model/moe.py) asks its EP backend only what the backend declares
(BackendCaps): the router kernel lists a decode step's routes by expert for backends that read the
listing, up to the rows it lists at once; steps above that (an explicit --max-active above it), and
backends that move rows, go through the route plan; and the router's ticket is handed out only where
the configuration takes the one-launch form. The gate runs with the layer's KernelConfig, and in
batch-invariant mode a token's routed output (gate, experts, combine) is the same bits alone and
inside crowds of 1 to 256 tokens (the reference form, CPU, float32 and bfloat16)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton", reason="the kernel forms' limits live in Triton kernel modules")

from pegainfer.engine.config import ModelConfig  # noqa: E402
from pegainfer.engine.kernels.config import KernelConfig  # noqa: E402
from pegainfer.engine.model.mlp import MLP  # noqa: E402
from pegainfer.engine.model.moe import MoE  # noqa: E402
from pegainfer.engine.model.route_counts import RouteCounts  # noqa: E402
from pegainfer.engine.presets import preset_config  # noqa: E402
from pegainfer.ep.backend import BackendCaps  # noqa: E402
from pegainfer.ep.backends.local import LocalBackend  # noqa: E402
from pegainfer.ep.experts import ExpertKernel, ExpertShard  # noqa: E402
from tests.engine.kernels.route_crowds import SIZES, crowd  # noqa: E402


def _moe(expert_kernel: str, kernels: KernelConfig = KernelConfig()) -> MoE:
    cfg = ModelConfig.from_dict(preset_config("tiny"), "test")
    e, h, i = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
    shard = ExpertShard(range(e), {1: torch.randn(e, 2 * i, h)}, {1: torch.randn(e, h, i)})
    shared = MLP(torch.randn(i, h), torch.randn(i, h), torch.randn(h, i), kernels)
    return MoE(1, cfg, torch.randn(e, h), shared, LocalBackend(shard, ExpertKernel(expert_kernel)),
               RouteCounts(e, "cpu"), torch.zeros(1, dtype=torch.int32))


def test_local_backend_hands_steps_above_the_router_limit_to_the_route_plan():
    from pegainfer.engine.kernels.moe_route import MAX_TOKENS
    moe = _moe("triton")  # as chosen on CUDA bf16
    assert moe.backend.caps == BackendCaps(graph_safe=True, expert_kernel="triton", fused_alignment=True)
    al = moe._alignment(MAX_TOKENS)
    assert al is not None and al.totals is moe.routes.totals and al.ticket is moe.ticket
    assert moe._alignment(MAX_TOKENS + 1) is None


def test_backends_that_do_not_read_the_listing_get_none():
    for kernel in ("grouped_mm", "loop"):
        moe = _moe(kernel)
        assert not moe.backend.caps.fused_alignment and moe._alignment(1) is None
        assert moe.backend.caps.graph_safe == (kernel != "loop")
        with pytest.raises(NotImplementedError, match="route plan"):
            moe.backend.run_aligned(1, torch.zeros(1, 4), torch.zeros(1, 2), None)


def test_the_ticket_goes_with_the_one_launch_router_only():
    moe = _moe("triton", dataclasses.replace(KernelConfig(), router_one_launch=False))
    assert moe._alignment(1).ticket is None


def test_the_reference_form_counts_its_routes():
    moe = _moe("loop", KernelConfig(triton=False))
    x = torch.randn(5, moe.cfg.hidden_size)
    out = moe.decode(x)  # without the Triton kernels: the reference form, one tensor
    assert out.shape == x.shape and torch.equal(out, moe(x))
    assert sum(moe.routes.take()) == 2 * 5 * moe.cfg.num_experts_per_tok and sum(moe.routes.take()) == 0


def test_the_gate_runs_with_the_layers_kernel_config():
    for kernels in (KernelConfig(), KernelConfig(batch_invariant=False)):
        moe = _moe("loop", kernels)
        seen = []
        moe._gate(lambda x, w, **kw: seen.append(kw["kernels"]), torch.zeros(1, moe.cfg.hidden_size))
        assert seen == [kernels] and seen[0] is moe.kernels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tokens_routed_output_is_batch_invariant(dtype):
    """The shared experts' weights zero (their MLP is another module's), so the layer's output is the
    routed part: route, the route plan, the loop experts and the plan's combine."""
    g = torch.Generator().manual_seed(0)
    cfg = ModelConfig.from_dict(preset_config("tiny"), "test")
    e, h, i = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
    shard = ExpertShard(range(e), {1: (torch.randn(e, 2 * i, h, generator=g) / 8).to(dtype)},
                        {1: (torch.randn(e, h, i, generator=g) / 8).to(dtype)})
    kernels = KernelConfig(triton=False)
    shared = MLP(*(torch.zeros(i, h, dtype=dtype),) * 2, torch.zeros(h, i, dtype=dtype), kernels)
    moe = MoE(1, cfg, torch.randn(e, h, generator=g), shared, LocalBackend(shard, ExpertKernel("loop")),
              RouteCounts(e, "cpu"), torch.zeros(1, dtype=torch.int32))
    for _ in range(2):
        probe = torch.randn(1, h, generator=g).to(dtype)
        alone = moe(probe)
        for size in SIZES:
            rows, pos = crowd(probe, size, g)
            assert torch.equal(moe(rows)[pos], alone[0]), (size, pos)
