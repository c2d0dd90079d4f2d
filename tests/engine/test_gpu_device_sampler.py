"""The device sampler inside the captured decode graph on CUDA (skipped without a GPU; issue 33): the
Triton sampler (engine/kernels/sample.py) replayed in the graph, fed by the per-slot history and
bias and the static per-row parameters, against the same graphs returning logits to engine.sampler
("off", the path before issue 33), on mixed batches, overlapped and not, in bfloat16: ties between
logits are common, and the kernel breaks a tie at a top-k / top-p boundary by column where torch's
sort breaks it its own way, so the greedy rows, penalised or not, are the same token for token, and
the sampled ones agree almost everywhere. Only bfloat16: float32 on CUDA runs the per-expert loop,
which reads counts on the host, so no decode graph is captured (ExpertKernel.choose; the H100 run of
2026-12-05 showed the float32 fixture's engine without graphs). The float32 comparison, token and
log-prob exact, runs on the CPU with the graphs replayed there: tests/engine/test_device_sampler.py.
Bitwise batch invariance through this path: tests/engine/test_gpu_batch_invariance.py.
Run on a GPU machine: pytest tests/engine/test_gpu_device_sampler.py"""
from __future__ import annotations

import pytest
import torch

from pegainfer.engine.engine import EngineSpec, build_engine
from tests.engine.test_device_sampler import MIXED, assert_same, serve_with

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

GREEDY_ROWS = ("greedy", "logprobs", "greedy-pen")


@pytest.fixture(scope="module")
def engine():
    e = build_engine(EngineSpec(random_preset="tiny", device="cuda:0", dtype="bfloat16", num_slots=12,
                                kv_cache_tokens=12 * 4096))  # not most of the free memory
    assert e.runner.graphs is not None and e.runner.graphs.sampler is not None and e.runner.graphs.sampler.kernel
    yield e
    e.close()


@pytest.mark.parametrize("overlap", [True, False])
def test_the_graph_sampler_chooses_what_engine_sampler_chooses(engine, overlap):
    off, _, off_kinds = serve_with(engine, "off", MIXED, overlap)
    got, overlapped, kinds = serve_with(engine, "auto", MIXED, overlap)
    assert off_kinds == {"logits"} and {"sample", "sample_lp"} <= kinds
    assert (overlapped > 0) == overlap  # sampled decode steps ran launched, fed on the device
    assert_same({k: v for k, v in got.items() if k[0] in GREEDY_ROWS},
                {k: v for k, v in off.items() if k[0] in GREEDY_ROWS}, atol=1e-4)
    same = total = 0
    for key in off:
        a, b = [t for t, _, _ in got[key]], [t for t, _, _ in off[key]]
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(b))
        same, total = same + first, total + len(b)  # tokens up to the first difference
    assert same >= 0.8 * total, f"only {same} of {total} sampled tokens agree before a divergence"


def test_a_request_draws_the_same_tokens_in_any_batch_on_the_gpu(engine):
    """Seeds, penalties, bias and log-probs, alone and beside everything else, launched: bit for bit
    (bfloat16, where the decode step runs the batch-invariant Triton kernels; float32 on CUDA runs
    cuBLAS, whose sums depend on the batch)."""
    if not engine.model.kernels.batch_invariant or not engine.model.kernels.triton:
        pytest.skip("the decode forward is batch-invariant only with the Triton kernels (bfloat16)")
    crowd, _, _ = serve_with(engine, "auto", MIXED)
    for a in MIXED[1:]:
        alone, _, _ = serve_with(engine, "auto", [a])
        for key in alone:
            assert alone[key] == crowd[key], key
