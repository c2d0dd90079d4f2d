"""The whole Triton-fused decode step (fused norms, MLA decode kernels with the one-row output
kernel, the fused router, expert MLP and combine) computes the reference forward's logits on the
tiny model, in float32 under Triton's CPU interpreter; on the GPU the same code runs compiled (in
bfloat16)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import sys
import torch
from engine.batch import Batch, RowInput
from engine.decode import DecodeInputs, decode_logits
from engine.engine import EngineSpec, build_engine
from engine.step_plan import StepPlan
engine = build_engine(EngineSpec(model_dir=sys.argv[1], num_slots=4))
model, cache = engine.model, engine.cache
prompts = [[5, 9, 200, 31], list(range(40, 70)), [7]]
slots = [cache.allocate() for _ in prompts]
first = engine.runner.run(StepPlan.greedy([RowInput(s, p, 0) for s, p in zip(slots, prompts)])).tokens
pos = [len(p) for p in prompts]
model.backend.kernel = "triton"  # the fused expert kernels (chosen on CUDA bf16 at start-up)
t = torch.tensor
# three rows, then the first row alone (one row takes the attention output kernel, mla_output)
for step, n in enumerate([3, 3, 3, 1, 1]):
    slots, first, pos = slots[:n], first[:n], pos[:n]
    saved = cache.data.clone()
    rows = [RowInput(s, [tok], p) for s, tok, p in zip(slots, first, pos)]
    ref = model.forward(Batch.build(rows, "cpu"), cache)  # [R, V]
    ref_cache = cache.data.clone()
    cache.data.copy_(saved)
    model.use_kernels(True)
    got = decode_logits(model, DecodeInputs(t(first), t(pos), t(slots), t(pos) + 1, length=max(pos) + 5), cache)
    model.use_kernels(False)
    rel = (got - ref).norm() / ref.norm()
    assert rel < 1e-5, (step, rel)
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    assert torch.allclose(cache.data, ref_cache, atol=1e-5)
    first = got.argmax(-1).tolist()
    pos = [p + 1 for p in pos]
print("ok")
"""


def test_fused_decode_step_matches_reference_forward(tiny_model_dir):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model_dir)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]
