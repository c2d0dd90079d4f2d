"""The prefill graphs' batch-invariant form (engine/prefill_graphs.py) run eagerly on the CPU, the
Triton kernels in the interpreter: a pack of a fresh prompt, a prompt continuing a cached prefix (a
prefix-cache hit) and a later chunk of a long prompt, its keys gathered from the paged cache through
the slots' pages, gives the bits of the reference path (ModelRunner's eager forward) for every row,
logits and greedy tokens, and writes the same latents; fits() takes such packs only when the keys are
gathered, and refuses one whose keys exceed the largest bank."""
from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.engine.batch import Batch, RowInput  # noqa: E402
from pegainfer.engine.engine import EngineSpec, build_engine  # noqa: E402
from pegainfer.engine.kernels.config import KernelConfig  # noqa: E402
from pegainfer.engine.prefill_graphs import PrefillGraphs  # noqa: E402
from tests.engine.model_builds import rebuild  # noqa: E402


def test_a_pack_continuing_cached_prefixes_has_the_reference_bits(triton_interpreter, tiny_model_dir):
    engine = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=4, max_model_len=512))
    model = rebuild(engine, KernelConfig(), "loop")  # the Triton prompt attention, batch-invariant
    cache = engine.cache
    g = torch.Generator().manual_seed(1)
    prompt = lambda n: torch.randint(3, 900, (n,), generator=g).tolist()  # noqa: E731
    prefix, long_prompt, fresh = prompt(64 + 21), prompt(150), prompt(37)
    a, b, c = cache.allocate(200), cache.allocate(200), cache.allocate(200)
    shared = cache.allocate(64)
    cache.attach(b, cache.slot_pages[shared][:1])  # b's first page is another request's cached one
    cache.release(shared)  # ... and outlives that request
    model.forward(Batch.build([RowInput(b, prefix[:64], 0), RowInput(c, long_prompt[:100], 0)], "cpu"), cache)
    rows = [RowInput(a, fresh, 0), RowInput(b, prefix[64:], 64, prompt=True), RowInput(c, long_prompt[100:], 100,
                                                                                      prompt=True)]
    before = cache.data.clone()
    want = model.forward(Batch.build(rows, "cpu"), cache)  # [3, V] the reference (eager) path
    want_cache = cache.data.clone()
    graphs = PrefillGraphs(model, cache, None, max_tokens=256)
    assert graphs.banked and graphs.fits(rows)
    cache.data.copy_(before)
    got = graphs.run(rows, logits=True)
    assert torch.equal(got, want)
    assert torch.equal(cache.data[:, : cache.num_pages], want_cache[:, : cache.num_pages])  # the scratch page aside
    assert graphs.run(rows) == want.argmax(-1).tolist()
    assert {(t, nb) for t, nb, _, _ in graphs.graphs} == {(128, 1024)}  # 91 tokens; 85 + 150 + 37 keys + padding
    fresh_only = [RowInput(a, fresh, 0)]
    cache.data.copy_(before)
    assert graphs.run(fresh_only, logits=True).equal(model.forward(Batch.build(fresh_only, "cpu"), cache))
    assert (64, 64, True, False) in graphs.graphs  # a fresh pack's bank is the pack itself
    too_long = [RowInput(a, [5] * 10, 33000)]
    assert not graphs.fits(too_long)
    plain = PrefillGraphs(rebuild(engine, dataclasses.replace(KernelConfig(), batch_invariant=False), "loop"), cache,
                          None, max_tokens=256)
    assert not plain.banked and not plain.fits(rows) and plain.fits(fresh_only)
    engine.close()
