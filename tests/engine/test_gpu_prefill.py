"""Packed prefill on CUDA (skipped without a GPU): several fresh prompts in one prefill graph, their
attention by the Triton packed-prompt kernel, against the dense-mask SDPA path on the same inputs
and against each prompt prefilled alone (bf16, so within rounding, not bit for bit). Run on a GPU
machine: pytest tests/engine/test_gpu_prefill.py"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from pegainfer.engine.batch import RowInput
from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.model.inputs import PrefillInputs
from pegainfer.engine.model.prefill import prefill_logits

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

LENGTHS = [100, 1, 300, 37]


@pytest.fixture(scope="module")
def engine():
    e = build_engine(EngineSpec(random_preset="tiny", device="cuda:0", dtype="bfloat16", num_slots=8,
                                kv_cache_tokens=8 * 4096))  # not most of the free memory: the test clones it
    assert e.runner.prefill_graphs is not None and e.model.layers[0].attn.fused_prefill
    yield e
    e.close()


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 900, (n,), generator=g).tolist() for n in LENGTHS]


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert (a.float() - b.float()).abs().max() <= 0.03 * b.float().abs().max(), (a.float() - b.float()).abs().max()


def test_packed_kernel_matches_the_mask_path(engine):
    model, cache = engine.model, engine.cache
    prompts = _prompts()
    dev = cache.data.device
    ids = torch.tensor([t for p in prompts for t in p], device=dev)
    pos = torch.cat([torch.arange(len(p)) for p in prompts]).to(dev)
    rows = torch.cat([torch.full((len(p),), i) for i, p in enumerate(prompts)]).to(dev)
    held = [cache.allocate(len(p)) for p in prompts]  # each prompt's pages
    slots = torch.tensor(held, device=dev)[rows]
    last = torch.tensor(LENGTHS, device=dev).cumsum(0) - 1
    inp = PrefillInputs(ids, pos, slots, rows, last)
    fused = prefill_logits(model, inp, cache)
    from tests.engine.model_builds import rebuild  # the same weights, built without the Triton kernels
    plain = rebuild(engine, dataclasses.replace(model.kernels, triton=False), engine.backend.caps.expert_kernel)
    assert not plain.layers[0].attn.fused_prefill
    masked = prefill_logits(plain, inp, cache)
    for s in held:
        cache.release(s)
    _close(fused, masked)


def test_a_pack_in_one_graph_matches_each_prompt_alone(engine):
    pg = engine.runner.prefill_graphs
    prompts = _prompts()
    slots = [engine.cache.allocate() for _ in prompts]
    try:
        rows = [RowInput(s, p, 0) for s, p in zip(slots, prompts)]
        assert pg.fits(rows)
        packed = pg.run(rows, logits=True).float().clone()  # 438 tokens: the 512 bucket, 74 padding tokens
        for i, row in enumerate(rows):
            _close(packed[i], pg.run([row], logits=True).float()[0])
    finally:
        for s in slots:
            engine.cache.release(s)


def test_a_graph_pack_continuing_cached_prefixes_is_bit_exact(engine):
    """Batch-invariant graphs gather each row's keys from the paged cache (engine/prefill_graphs.py):
    a prefix-cache hit's suffix and a long prompt's later chunk, packed with a fresh prompt and
    replayed in a captured graph, give the eager path's bits."""
    from pegainfer.engine.batch import Batch
    pg, cache, model = engine.runner.prefill_graphs, engine.cache, engine.model
    assert pg.banked
    prefix, long_prompt, fresh = _prompts()[2][:85], _prompts()[2], _prompts()[0]
    slots = [cache.allocate(400) for _ in range(3)]
    try:
        a, b, c = slots
        pg.run([RowInput(b, prefix[:64], 0), RowInput(c, long_prompt[:200], 0)])  # the cached parts
        rows = [RowInput(a, fresh, 0), RowInput(b, prefix[64:], 64, prompt=True),
                RowInput(c, long_prompt[200:], 200, prompt=True)]
        assert pg.fits(rows)
        before = cache.data.clone()
        got = pg.run(rows, logits=True).clone()
        cache.data.copy_(before)
        want = model.forward(Batch.build(rows, "cuda:0"), cache)
        assert torch.equal(got, want), (got.float() - want.float()).abs().max()
    finally:
        for s in slots:
            cache.release(s)


def test_after_the_warm_up_no_step_captures_a_graph(engine):
    """engine.warmup captures every key first: a chunked prompt beside decode rows, sampled and greedy,
    then finds every graph it needs already there."""
    from pegainfer.engine.contract import Admit, SamplingParams
    from pegainfer.engine.warmup import run_requests, warm_up
    report = warm_up(engine, max_prefill_tokens=engine.spec.max_prefill_tokens)
    dg, pg = engine.runner.graphs, engine.runner.prefill_graphs
    assert set(dg.graphs) == set(report.decode_keys) and set(pg.graphs) == set(report.prefill_keys)
    before = (len(dg.graphs), len(pg.graphs))
    p = _prompts()
    run_requests(engine, [Admit("d", p[1], 40, True), Admit("long", p[0] * 30, 3, True),
                          Admit("s", p[3], 5, True, SamplingParams(temperature=0.7, seed=1, logprobs=2))],
                 max_prefill_tokens=1024, mixed_step_tokens=256)
    assert (len(dg.graphs), len(pg.graphs)) == before
