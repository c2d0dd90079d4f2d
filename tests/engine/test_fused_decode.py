"""The whole Triton-fused decode step (fused norms, MLA decode kernels with the one-row output and
input kernels, the fused router, expert MLP and combine, the head and argmax launches) computes the
reference forward's logits and greedy tokens on the tiny model, in float32 under Triton's CPU
interpreter, writing the same cache entries; on the GPU the same code runs compiled (in bfloat16).
One decode function for both: the model's KernelConfig selects the kernels inside it."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.engine.batch import Batch, RowInput  # noqa: E402
from pegainfer.engine.engine import EngineSpec, build_engine  # noqa: E402
from pegainfer.engine.kernels.config import KernelConfig  # noqa: E402
from pegainfer.engine.model.decode import decode_logits, decode_step  # noqa: E402
from pegainfer.engine.model.inputs import DecodeInputs  # noqa: E402
from pegainfer.engine.step_plan import StepPlan  # noqa: E402
from tests.engine.model_builds import rebuild  # noqa: E402


def test_fused_decode_step_matches_reference_forward(triton_interpreter, tiny_model_dir):
    engine = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=4))
    assert not engine.model.kernels.triton  # CPU: the reference forms
    fused = rebuild(engine, KernelConfig(), "triton")  # the same weights, every Triton kernel
    cache = engine.cache
    prompts = [[5, 9, 200, 31], list(range(40, 70)), [7]]
    slots = [cache.allocate() for _ in prompts]
    first = engine.runner.run(StepPlan.greedy([RowInput(s, p, 0) for s, p in zip(slots, prompts)])).tokens
    pos = [len(p) for p in prompts]
    t = torch.tensor
    # three rows, then the first row alone (one row takes the attention output kernel, mla_output,
    # the layer-input kernel, norm_proj, and the head with the argmax, head_argmax)
    for step, n in enumerate([3, 3, 3, 1, 1]):
        slots, first, pos = slots[:n], first[:n], pos[:n]
        saved = cache.data.clone()
        rows = [RowInput(s, [tok], p) for s, tok, p in zip(slots, first, pos)]
        ref = engine.model.forward(Batch.build(rows, "cpu"), cache)  # [R, V]
        ref_cache = cache.data.clone()
        cache.data.copy_(saved)
        inp = DecodeInputs(t(first), t(pos), t(slots), t(pos) + 1, length=max(pos) + 5)
        got = decode_logits(fused, inp, cache)
        rel = (got - ref).norm() / ref.norm()
        assert rel < 1e-5, (step, rel)
        assert torch.equal(got.argmax(-1), ref.argmax(-1))
        assert torch.allclose(cache.data, ref_cache, atol=1e-5)
        if step in (0, 3):  # the greedy step: the argmax launch at three rows, the head with it at one
            cache.data.copy_(saved)
            assert decode_step(fused, inp, cache).tolist() == ref.argmax(-1).tolist()
            assert not fused.argmax_ticket.any()
        first = got.argmax(-1).tolist()
        pos = [p + 1 for p in pos]
    engine.close()
