"""engine/kernels/mla_decode.py: the split MLA decode attention is a softmax over each row's own length
of the cached latent, and both merge kernels apply W_UV as the direct product does. Through the
attention (MLAttention.decode_absorbed: the prep, split and merge launches, then o_proj), the torch
path's output for the tiny preset's heads, the q LoRA path, non-power-of-two head dims and bfloat16
(there judged against float32 arithmetic on the same bf16 values: as accurate as the torch path).
Triton's CPU interpreter."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from tests.engine.kernels import mla_cases  # noqa: E402

B, H, RANK, ROPE, SLOTS, N = 3, 16, 64, 16, 4, 80


def _inputs(gen: torch.Generator) -> tuple:
    cache = torch.randn(SLOTS, N, RANK + ROPE, generator=gen)
    q = torch.randn(B, H, RANK + ROPE, generator=gen)
    return cache, q, torch.tensor([2, 0, 3]), torch.tensor([1, 37, 80])


def test_split_attention_is_a_softmax_over_each_rows_length(triton_interpreter, gen):
    from pegainfer.engine.kernels.mla_decode import mla_decode
    cache, q, slots, lens = _inputs(gen)
    got = mla_decode(q, cache, slots, lens, 80, 0.3, RANK, split_len=32, merge="row")
    for b in range(B):
        kv = cache[slots[b], : lens[b]]
        p = ((q[b] @ kv.T) * 0.3).softmax(-1)
        want = p @ kv[:, :RANK]
        assert torch.allclose(got[b], want, atol=1e-4), (b, (got[b] - want).abs().max())


def test_both_merges_apply_w_uv(triton_interpreter, gen):
    from pegainfer.engine.kernels.mla_decode import mla_decode
    cache, q, slots, lens = _inputs(gen)
    v = 24
    w_uv = torch.randn(H, RANK, v, generator=gen)
    o_lat = mla_decode(q, cache, slots, lens, 80, 0.3, RANK, split_len=32, merge="row")  # [B, H, RANK]
    want = torch.einsum("bhr,hrv->bhv", o_lat, w_uv).reshape(B, H * v)
    for merge in ("row", "block"):
        got = mla_decode(q, cache, slots, lens, 80, 0.3, RANK, split_len=32, merge=merge, w_uv_t=w_uv)
        assert torch.allclose(got, want, atol=1e-4), (merge, (got - want).abs().max())


def test_split_and_merge_follow_the_config():
    from pegainfer.engine.kernels.mla_decode import auto_split, merge_form
    # enough splits that rows x splits reach the program target, no split under one block of 32 keys
    assert auto_split(1, 1024, 264) == 32 and auto_split(64, 1024, 264) == 224 and auto_split(1, 1024, 8) == 128
    assert auto_split(300, 300, 264) == 320  # one split: the whole bound in blocks of 32
    assert merge_form(32, 32) == "row" and merge_form(33, 32) == "block"


@pytest.mark.parametrize("overrides,dtype,positions,seed", mla_cases.CASES, ids=mla_cases.IDS)
def test_decode_absorbed_matches_the_torch_path(triton_interpreter, request, overrides, dtype, positions, seed):
    if dtype == torch.bfloat16:
        request.getfixturevalue("bf16_as_gpu")
    c = mla_cases.case(overrides, dtype, positions, seed)
    o_ref, o_got, _, _ = c.both(lambda attn, cache: attn.decode_absorbed(c.x, c.inp, cache))
    assert o_got.shape == (c.x.shape[0], c.cfg.hidden_size) and o_got.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(o_got, o_ref, rtol=1e-4, atol=1e-4)
        return
    # no closer to the torch path than rounding allows: judge both against float32 arithmetic on the
    # same bf16 values; the fused path must be as accurate as the torch path
    _, exact = mla_cases.attention(overrides, torch.float32, mla_cases.FUSED, grain=dtype)
    want = exact.decode_absorbed(c.x.float(), c.inp, mla_cases.copy(c.cache, torch.float32))  # [B, H]
    rel = mla_cases.rel
    assert rel(o_got, want) < 1.5 * rel(o_ref, want), (rel(o_got, want), rel(o_ref, want))
    assert rel(o_got, o_ref) < 1e-2, rel(o_got, o_ref)
