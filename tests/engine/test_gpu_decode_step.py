"""The decode step on CUDA (skipped without a GPU): the tiny model's one-row graphed steps (bf16, CUDA
graphs, Triton kernels) choose the same greedy tokens with the LM head and the argmax in one launch
(KernelConfig.head_argmax_rows 1, the default without batch invariance: the engine turns the one-row
kernels off in batch-invariant mode) as with F.linear and the argmax kernel (0). The kernel itself:
tests/engine/kernels/test_head_argmax.py.
Run on a GPU machine: pytest tests/engine/test_gpu_decode_step.py"""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_one_row_steps_choose_as_the_two_launch_form(tiny_model_dir):
    from pegainfer.engine.engine import EngineSpec, build_engine
    from pegainfer.engine.generate import generate
    from pegainfer.engine.kernels.config import KernelConfig
    prompts = [[5, 17, 300, 2], [900, 1, 44], [7] * 20]

    def tokens(rows: int) -> list[list[int]]:
        engine = build_engine(EngineSpec(model_dir=str(tiny_model_dir), device="cuda", dtype="bfloat16", num_slots=1,
                                         kv_cache_tokens=4096,
                                         kernels=KernelConfig(head_argmax_rows=rows, batch_invariant=False)))
        try:
            assert engine.runner.graphs is not None and engine.model.kernels.triton
            assert engine.model.kernels.head_argmax_rows == rows
            return [generate(engine, [p], 24, ignore_eos=True)[0].token_ids for p in prompts]
        finally:
            engine.close()

    assert tokens(1) == tokens(0)
