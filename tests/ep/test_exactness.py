"""The exactness gate: every multi-rank backend gives `local`'s bits. The MoE expert outputs of a
batch are torch.equal in float32 for every layer, and greedy generation (batched rows and single
rows) gives the same tokens, from a checkpoint and from the random preset, in float32 and bfloat16."""
from __future__ import annotations

import pytest
import torch

from pegainfer.engine.generate import generate
from tests.ep.conftest import PROMPTS, random_batch

# (backend, ep size, weights source, dtype, chunk bytes): every multi-rank shape the gate covers. On
# CPU the nccl backend's code runs through its test-only twin over gloo (ep/backends/nccl_over_gloo_test.py).
CASES = {
    "host-staged-ep2": ("host-staged", 2, "checkpoint", "float32", None),
    "host-staged-ep4": ("host-staged", 4, "preset", "float32", None),
    "nccl-over-gloo-test-ep2": ("nccl-over-gloo-test", 2, "checkpoint", "float32", None),
    "nccl-over-gloo-test-ep3-chunked": ("nccl-over-gloo-test", 3, "preset", "float32", 1000),  # many all-to-alls per layer
    "nccl-over-gloo-test-ep2-bf16": ("nccl-over-gloo-test", 2, "preset", "bfloat16", None),
}


def _source(kind: str, tiny_model_dir) -> dict:
    return {"model_dir": str(tiny_model_dir)} if kind == "checkpoint" else {"random_preset": "tiny", "seed": 0}


@pytest.fixture(scope="module")
def pair(engine_cache, tiny_model_dir, request):
    """(local engine, backend engine) over the same weights for CASES[request.param]."""
    backend, ep, source, dtype, chunk = CASES[request.param]
    src = _source(source, tiny_model_dir)
    local = engine_cache(**src, dtype=dtype)
    mp = pytest.MonkeyPatch()
    if chunk is not None:
        mp.setenv("PEGAINFER_EP_CHUNK_BYTES", str(chunk))
    try:
        other = engine_cache(**src, dtype=dtype, backend=backend, ep_size=ep)
    finally:
        mp.undo()
    assert other.backend.name == backend and other.maturity == other.backend.maturity
    return local, other


@pytest.mark.parametrize("pair", sorted(CASES), indirect=True)
def test_greedy_tokens_equal_local(pair) -> None:
    local, other = pair
    want = generate(local, PROMPTS, 12, ignore_eos=True)
    got = generate(other, PROMPTS, 12, ignore_eos=True)  # all rows batched in every step
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    single = generate(other, [PROMPTS[2]], 12, ignore_eos=True)
    assert single[0].token_ids == want[2].token_ids
    counters = other.counters.take()
    assert sum(counters.routes_per_rank) == sum(counters.routes_per_expert) > 0
    assert all(n > 0 for n in counters.routes_per_rank)  # every rank took part
    assert counters.collective_calls > 0 and counters.bytes_sent > 0 and counters.bytes_received > 0
    assert counters.exchange_s > 0


@pytest.mark.parametrize("pair", sorted(CASES), indirect=True)
def test_moe_expert_outputs_equal_local_bit_for_bit(pair) -> None:
    local, other = pair
    cfg = local.cfg
    dtype = local.spec.torch_dtype()
    k = cfg.num_experts_per_tok
    batches = [random_batch(cfg, 45, seed, dtype) for seed in range(2)]
    # edge cases: every route on rank 0's experts (nothing moves), every route on the last rank's
    batches.append(random_batch(cfg, 5, 7, dtype, torch.arange(k).repeat(5, 1)))
    batches.append(random_batch(cfg, 5, 8, dtype, torch.arange(cfg.n_routed_experts - k, cfg.n_routed_experts).repeat(5, 1)))
    for layer in cfg.moe_layers:
        for hidden, plan in batches:
            want = local.backend.expert_outputs(layer, hidden, plan)  # [R, H] float32
            got = other.backend.expert_outputs(layer, hidden, plan)
            assert got.dtype == torch.float32 and torch.equal(got, want), (layer, plan.expert_counts.tolist())
            assert torch.equal(plan.combine(got), plan.combine(want))
    other.counters.take()
