"""The graph-capturable decode step (MLA absorption, device-side routing and greedy choice) computes
the same function as the reference-order expand path, on CPU in float32."""
from __future__ import annotations

import torch

from pegainfer.engine.batch import Batch, RowInput
from pegainfer.engine.model.decode import decode_logits
from pegainfer.engine.model.inputs import DecodeInputs
from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.step_plan import StepPlan


def test_absorbed_decode_matches_expand_path(tiny_model_dir):
    engine = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=4))
    prompts = [[5, 9, 200, 31], list(range(40, 90)), [7]]
    slots = [engine.cache.allocate() for _ in prompts]
    rows = [RowInput(s, p, 0) for s, p in zip(slots, prompts)]
    first = engine.runner.run(StepPlan.greedy(rows)).tokens
    pos = [len(p) for p in prompts]
    for step in range(6):
        # the expand path on a copy of the cache, the absorbed path on the original
        saved = engine.cache.data.clone()
        rows = [RowInput(s, [t], p) for s, t, p in zip(slots, first, pos)]
        ref = engine.model.forward(Batch.build(rows, "cpu"), engine.cache)  # [R, V]
        engine.cache.data.copy_(saved)
        t = torch.tensor
        inp = DecodeInputs(t(first), t(pos), t(slots), t(pos) + 1, length=max(pos) + 9)
        got = decode_logits(engine.model, inp, engine.cache)
        rel = (got - ref).norm() / ref.norm()
        assert rel < 1e-5, (step, rel)
        assert torch.equal(got.argmax(-1), ref.argmax(-1))
        first = got.argmax(-1).tolist()
        pos = [p + 1 for p in pos]
    engine.close()


def test_packed_prefill_matches_row_by_row_prefill(tiny_model_dir):
    """Several fresh prompts packed into one masked sequence give each prompt's own first token
    and the same cache contents."""
    from pegainfer.engine.model.inputs import PrefillInputs
    from pegainfer.engine.model.prefill import prefill_step
    engine = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=4))
    prompts = [[5, 9, 200, 31], list(range(40, 90)), [7], [11, 12, 13]]
    slots = [engine.cache.allocate() for _ in prompts]
    ref = engine.runner.run(StepPlan.greedy([RowInput(s, p, 0) for s, p in zip(slots, prompts)])).tokens
    ref_cache = engine.cache.data.clone()
    engine.cache.data.zero_()
    ids, pos, sl, rows, last = [], [], [], [], []
    for r, (s, p) in enumerate(zip(slots, prompts)):
        ids += p
        pos += range(len(p))
        sl += [s] * len(p)
        rows += [r] * len(p)
        last.append(len(ids) - 1)
    pad = 8  # padding tokens: scratch slot, a row each
    ids += [0] * pad
    pos += range(pad)
    sl += [engine.cache.scratch_slot] * pad
    rows += range(100, 100 + pad)
    t = torch.tensor
    got = prefill_step(engine.model, PrefillInputs(t(ids), t(pos), t(sl), t(rows), t(last)), engine.cache)
    assert got.tolist() == ref
    real = engine.cache.data[:, : engine.cache.num_pages]  # every page but the scratch page
    assert torch.allclose(real, ref_cache[:, : engine.cache.num_pages], atol=1e-5)
    engine.close()


def test_one_prompt_pack_uses_plain_causal_attention(tiny_model_dir):
    """A pack of one prompt (padding after it) skips the T x T mask: same first token, same cache."""
    from pegainfer.engine.model.inputs import PrefillInputs
    from pegainfer.engine.model.prefill import prefill_logits
    engine = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=2))
    prompt = list(range(40, 77))
    slot = engine.cache.allocate()
    n, pad = len(prompt), 11
    t = torch.tensor
    inp = PrefillInputs(t(prompt + [0] * pad), t(list(range(n)) + list(range(pad))),
                        t([slot] * n + [engine.cache.scratch_slot] * pad), t([0] * n + list(range(100, 100 + pad))),
                        t([n - 1]))
    masked = prefill_logits(engine.model, inp, engine.cache)
    pages = engine.cache.slot_pages[slot]
    cache_masked = engine.cache.data[:, pages].clone()
    engine.cache.data.zero_()
    causal = prefill_logits(engine.model, inp, engine.cache, one_prompt=True)
    assert torch.allclose(causal, masked, atol=1e-5)
    assert torch.allclose(engine.cache.data[:, pages], cache_masked, atol=1e-6)
    engine.close()
