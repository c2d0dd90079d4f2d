"""The packed prefill step with the Triton packed-prompt attention (the model's KernelConfig `triton`)
computes the dense-mask path's logits on the tiny model: prompts of 1, 70 and 5 tokens and 3 padding
tokens packed into one sequence, in float32 under Triton's CPU interpreter (on the GPU:
tests/engine/test_gpu_prefill.py)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.engine.engine import EngineSpec, build_engine  # noqa: E402
from pegainfer.engine.kernels.config import KernelConfig  # noqa: E402
from pegainfer.engine.model.inputs import PrefillInputs  # noqa: E402
from pegainfer.engine.model.prefill import prefill_logits  # noqa: E402
from tests.engine.model_builds import rebuild  # noqa: E402


def test_packed_kernel_step_matches_the_mask_path(triton_interpreter):
    engine = build_engine(EngineSpec(random_preset="tiny", num_slots=4))
    fused = rebuild(engine, KernelConfig(), "loop")  # the same weights; the Triton prompt attention
    assert fused.layers[0].attn.fused_prefill and not engine.model.layers[0].attn.fused_prefill
    cache = engine.cache
    g = torch.Generator().manual_seed(0)
    lens, pads = [1, 70, 5], 3
    t = sum(lens) + pads
    ids = torch.randint(0, 1000, (t,), generator=g)
    positions = torch.cat([torch.arange(n) for n in lens] + [torch.zeros(pads, dtype=torch.int64)])
    rows = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)] + [torch.arange(10, 10 + pads)])
    held = [cache.allocate(n) for n in lens]  # pages for each prompt
    slots = torch.cat([torch.full((n,), s) for s, n in zip(held, lens)] + [torch.full((pads,), cache.scratch_slot)])
    inp = PrefillInputs(ids, positions, slots, rows, torch.tensor([0, 70, 75]))
    masked = prefill_logits(engine.model, inp, cache)
    masked_cache = cache.data.clone()
    cache.data.zero_()
    got = prefill_logits(fused, inp, cache)
    assert torch.allclose(got, masked, rtol=1e-5, atol=1e-5), (got - masked).abs().max()
    assert torch.allclose(cache.data, masked_cache, atol=1e-4)  # later layers: within the attention's sums
    engine.close()
