"""The graph-capturable decode step (MLA absorption, device-side routing and greedy choice) computes
the same function as the reference-order expand path, on CPU in float32."""
from __future__ import annotations

import torch

from engine.batch import Batch, RowInput
from engine.decode import DecodeInputs, decode_logits
from engine.engine import EngineSpec, build_engine


def test_absorbed_decode_matches_expand_path(tiny_model_dir):
    engine = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=4))
    prompts = [[5, 9, 200, 31], list(range(40, 90)), [7]]
    slots = [engine.cache.allocate() for _ in prompts]
    rows = [RowInput(s, p, 0) for s, p in zip(slots, prompts)]
    first = engine.runner.step(rows)
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
