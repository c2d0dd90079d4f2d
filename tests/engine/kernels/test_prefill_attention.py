"""engine/kernels/prefill_attention.py: causal attention over fresh prompts packed back to back is SDPA
per prompt (Triton's CPU interpreter): prompts of 1, 70 and 5 tokens, then 3 padding tokens (each a
prompt of its own at position 0); the 70-token prompt crosses key blocks. The whole prefill step with
it is tests/engine/test_fused_prefill.py; on the GPU, tests/engine/test_gpu_prefill.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")


def test_packed_attention_is_sdpa_per_prompt(triton_interpreter, gen):
    from pegainfer.engine.kernels.prefill_attention import packed_causal_attention
    lens, pads = [1, 70, 5], 3
    t, nh, nope, rope, v_dim = sum(lens) + pads, 3, 16, 8, 12
    q = torch.randn(t, nh, nope + rope, generator=gen)
    kvb = torch.randn(t, nh, nope + v_dim, generator=gen)  # the expanded [k_nope | v] of each head, as kv_b makes it
    k_nope, v = kvb.split([nope, v_dim], dim=-1)
    kv = torch.randn(t, 20 + rope, generator=gen)  # latent (20) then the roped key
    k_pe = kv[:, 20:]
    positions = torch.cat([torch.arange(n) for n in lens] + [torch.zeros(pads, dtype=torch.int64)])
    got = packed_causal_attention(q, k_nope, k_pe, v, positions, 0.25)
    start = 0
    for n in lens + [1] * pads:
        sl = slice(start, start + n)
        k = torch.cat([k_nope[sl], k_pe[sl, None, :].expand(n, nh, rope)], dim=-1)
        want = F.scaled_dot_product_attention(q[sl].transpose(0, 1), k.transpose(0, 1), v[sl].transpose(0, 1),
                                              is_causal=True, scale=0.25).transpose(0, 1)
        assert torch.allclose(got[sl], want, atol=1e-5), (n, (got[sl] - want).abs().max())
        start += n
