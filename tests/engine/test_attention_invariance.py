"""MLA attention outside the decode kernel is batch-invariant on the CPU (KernelConfig.batch_invariant,
the blocked torch form, engine/model/blocked_attention.py), tiny shapes, float32 and bfloat16: a
prompt's per-token outputs and cached latents are bitwise the same prefilled alone, packed beside 1-5
other prompts at other offsets, from position 0 through the reference path, and cut into chunks of
1, 3, 17, ... tokens beside decode rows and other chunks; a decode row's output and latent are the
same beside rows with longer and shorter contexts. Off, the same comparisons differ (the test can
fail), and the two modes agree within the attention's rounding. The Triton form of the same cases
(interpreter and GPU): tests/engine/kernels/test_prefill_attention.py."""
from __future__ import annotations

import random

import pytest
import torch

from pegainfer.engine.kernels.config import KernelConfig
from tests.engine.prompt_cases import decode_cases, layer, prompt_cases

TORCH = KernelConfig(triton=False)
DTYPES = [torch.float32, torch.bfloat16]
# the full V2's q LoRA (q_a, its norm, q_b); head dims that are no power of two
VARIANTS = {"tiny": {}, "q-lora": {"q_lora_rank": 24},
            "odd-dims": {"qk_nope_head_dim": 12, "qk_rope_head_dim": 6, "kv_lora_rank": 40, "v_head_dim": 20}}


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_prompt_is_the_same_alone_packed_and_chunked(variant, dtype):
    lay = layer("tiny", dtype, TORCH, overrides=VARIANTS[variant])
    prompt_cases(lay, random.Random(0), 150, [[1], [3], [17], [64], [5, 1, 30], [100]])


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("ctx", [1, 64, 65, 200])
def test_a_decode_row_is_the_same_beside_any_rows(ctx, dtype):
    lay = layer("tiny", dtype, TORCH)
    decode_cases(lay, random.Random(ctx), ctx, [1, 2, 7, 22])


def test_without_invariance_the_same_cases_differ():
    """The library's attention picks its blocking by the shapes: the comparisons above can fail (shown
    in float32; in bfloat16 the output's rounding hides most of the reference's differences)."""
    lay = layer("tiny", torch.float32, KernelConfig(triton=False, batch_invariant=False))
    with pytest.raises(AssertionError):
        prompt_cases(lay, random.Random(0), 150, [[1], [3], [5, 1, 30]])


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_the_invariant_attention_is_the_reference_within_rounding(dtype):
    """Both modes over one mix of fresh prompts, later chunks and decode rows, on the same cache."""
    on, off = (layer("tiny", dtype, KernelConfig(triton=False, batch_invariant=b)) for b in (True, False))
    rows = []
    for slot, (n, start) in enumerate([(1, 0), (150, 0), (9, 40), (1, 299), (1, 63), (70, 64), (3, 0)]):
        if start:
            on.fill(slot, start)
        rows.append((slot, on.x(n), start))
    off.cache.data.copy_(on.cache.data)
    got, want = torch.cat(on.rows(rows)), torch.cat(off.rows(rows))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(on.cache.data.float(), off.cache.data.float(), rtol=tol, atol=tol)
    packs = [(0, on.x(1)), (1, on.x(150)), (2, on.x(33))]
    torch.testing.assert_close(torch.cat(on.packed(packs)).float(), torch.cat(off.packed(packs)).float(),
                               rtol=tol, atol=tol)
