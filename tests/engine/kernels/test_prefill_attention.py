"""engine/kernels/prefill_attention.py: causal attention over fresh prompts packed back to back is SDPA
per prompt (Triton's CPU interpreter): prompts of 1, 70 and 5 tokens, then 3 padding tokens (each a
prompt of its own at position 0); the 70-token prompt crosses key blocks. The whole prefill step with
it is tests/engine/test_fused_prefill.py; on the GPU, tests/engine/test_gpu_prefill.py.

The batch-invariant form, `prompt_attention`, is SDPA per prompt too, and a prompt's rows are bitwise
the same alone, packed beside other prompts at other offsets (and padding tokens), and cut into
chunks whose keys come from a bank beside other prompts' chunks: in the interpreter (float32, and
bfloat16 as the GPU rounds it) at small shapes, and on the GPU (triton_gpu) at lite's head shapes with
prompts up to 4,096 tokens. Through MLAttention (the Triton form: prefill_packed and the reference
path over the cache) the same cases as tests/engine/test_attention_invariance.py."""
from __future__ import annotations

import random

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


def _prompt(g: torch.Generator, n: int, nh: int, dims: tuple[int, int, int], dtype, device):
    """One prompt's q [n, nh, nope + rope], k_nope [n, nh, nope], k_pe [n, rope], v [n, nh, v]."""
    nope, rope, vd = dims
    q = torch.randn(n, nh, nope + rope, generator=g)
    kvb = torch.randn(n, nh, nope + vd, generator=g)  # as kv_b makes them: k_nope and v are views
    k_pe = torch.randn(n, 4 + rope, generator=g)[:, 4:]  # a view into the latent row, as in the model
    return [t.to(dtype).to(device) for t in (q, kvb)] + [k_pe.to(dtype).to(device)]


def _split(p, nope):
    q, kvb, k_pe = p
    return q, kvb[..., :nope], k_pe, kvb[..., nope:]


def _run(parts, nope, scale):
    """parts: [(prompt, query rows a..b, bank?)]: queries of each part in order; each prompt's keys once
    in the bank (in first-seen order) -> the output rows of every part."""
    from pegainfer.engine.kernels.prefill_attention import prompt_attention
    bank, base, qs, pos, bases = {}, 0, [], [], []
    for p, a, b in parts:
        if id(p) not in bank:
            bank[id(p)] = (base, p)
            base += p[0].shape[0]
        qs.append(p[0][a:b])
        pos.append(torch.arange(a, b))
        bases.append(torch.full((b - a,), bank[id(p)][0]))
    dev = qs[0].device
    kvb = torch.cat([p[1] for _, p in bank.values()])
    k_pe = torch.cat([p[2] for _, p in bank.values()])
    out = prompt_attention(torch.cat(qs), kvb[..., :nope], k_pe, kvb[..., nope:], positions=torch.cat(pos).to(dev),
                           bases=torch.cat(bases).to(dev), scale=scale)
    return list(out.split([b - a for _, a, b in parts]))


def _invariance(g, rnd, n, nh, dims, dtype, device, others_max, chunkings):
    """A prompt's rows alone (its own bank) against packs (a pack is its own bank: bases = index -
    position) and chunks beside other prompts' chunks."""
    target = _prompt(g, n, nh, dims, dtype, device)
    alone = _run([(target, 0, n)], dims[0], 0.3)[0]
    for others in range(1, 6):
        parts = [(_prompt(g, rnd.randint(1, others_max), nh, dims, dtype, device), None, None) for _ in range(others)]
        parts = [(p, 0, p[0].shape[0]) for p, _, _ in parts]
        at = rnd.randint(0, others)
        parts.insert(at, (target, 0, n))
        parts += [(_prompt(g, 1, nh, dims, dtype, device), 0, 1) for _ in range(rnd.randint(0, 3))]  # padding
        assert torch.equal(_run(parts, dims[0], 0.3)[at], alone), f"packed at {at} of {others + 1}"
    for sizes in chunkings:
        side = _prompt(g, others_max, nh, dims, dtype, device)
        got, a, i = [], 0, 0
        while a < n:
            b = min(a + sizes[i % len(sizes)], n)
            s = rnd.randint(0, others_max - 1)
            at = rnd.randint(0, 1)
            parts = [(side, s, rnd.randint(s + 1, others_max))]
            parts.insert(at, (target, a, b))
            got.append(_run(parts, dims[0], 0.3)[at])
            a, i = b, i + 1
        assert torch.equal(torch.cat(got), alone), f"chunks of {sizes}"


def test_prompt_attention_is_sdpa_per_prompt(triton_interpreter, gen):
    lens, nope = [1, 70, 5, 1, 1], 16
    prompts = [_prompt(gen, n, 3, (nope, 8, 12), torch.float32, "cpu") for n in lens]
    got = _run([(p, 0, n) for p, n in zip(prompts, lens)], nope, 0.25)
    for p, n, o in zip(prompts, lens, got):
        q, k_nope, k_pe, v = _split(p, nope)
        k = torch.cat([k_nope, k_pe[:, None, :].expand(n, 3, 8)], dim=-1)
        want = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                              is_causal=True, scale=0.25).transpose(0, 1)
        torch.testing.assert_close(o, want, rtol=1e-5, atol=1e-5)


def test_prompt_attention_is_invariant_in_the_interpreter(triton_interpreter, gen):
    _invariance(gen, random.Random(0), 150, 2, (16, 8, 12), torch.float32, "cpu", 90, [[1], [3], [17], [64, 5]])


def test_prompt_attention_is_invariant_in_bf16(bf16_as_gpu, gen):
    _invariance(gen, random.Random(1), 140, 2, (16, 8, 12), torch.bfloat16, "cpu", 70, [[3], [17, 1]])


LITE = (128, 64, 128)  # nope, rope, v of DeepSeek-V2-Lite's 16 heads


@pytest.mark.parametrize("n", [1, 63, 700, 4096])
def test_gpu_prompt_attention_is_invariant(triton_gpu, n):
    g = torch.Generator().manual_seed(n)
    chunkings = [[1], [3], [17], [5, 64, 1000]] if n <= 700 else [[17], [5, 64, 1000], [4095]]
    _invariance(g, random.Random(n), n, 16, LITE, torch.bfloat16, triton_gpu, 3000, chunkings)


def test_gpu_prompt_attention_is_sdpa_per_prompt(triton_gpu):
    g = torch.Generator().manual_seed(0)
    lens = [1, 300, 4096, 5]
    prompts = [_prompt(g, n, 16, LITE, torch.bfloat16, triton_gpu) for n in lens]
    got = _run([(p, 0, n) for p, n in zip(prompts, lens)], LITE[0], 0.1)
    for p, n, o in zip(prompts, lens, got):
        q, k_nope, k_pe, v = (t.float() for t in _split(p, LITE[0]))
        k = torch.cat([k_nope, k_pe[:, None, :].expand(n, 16, LITE[1])], dim=-1)
        want = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                              is_causal=True, scale=0.1).transpose(0, 1)
        torch.testing.assert_close(o.float(), want, rtol=2e-2, atol=2e-2)


def _triton_layer(preset: str, dtype: torch.dtype, **kw):
    from pegainfer.engine.kernels.config import KernelConfig
    from tests.engine.prompt_cases import layer
    lay = layer(preset, dtype, KernelConfig(), **kw)  # the Triton kernels, taken as able to run
    assert lay.attn.fused_prefill and lay.attn.invariant
    return lay


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_attention_through_the_kernel_is_invariant(triton_interpreter, request, dtype):
    """MLAttention with the Triton form: prefill_packed and the reference path over the cache."""
    from tests.engine.prompt_cases import decode_cases, prompt_cases
    if dtype == torch.bfloat16:
        request.getfixturevalue("bf16_as_gpu")
    lay = _triton_layer("tiny", dtype)
    prompt_cases(lay, random.Random(2), 80, [[17, 1, 5]])
    decode_cases(lay, random.Random(3), 65, [1, 6])


@pytest.mark.parametrize("n", [300, 4096])
def test_gpu_attention_through_the_kernel_is_invariant(triton_gpu, n):
    """Lite's attention layer in bf16 on the GPU: a prompt of n tokens alone, packed and chunked; a
    decode row at n beside crowds of up to 255 rows of other lengths."""
    from tests.engine.prompt_cases import decode_cases, prompt_cases
    lay = _triton_layer("lite", torch.bfloat16, device="cuda", max_len=4096, slots=260)
    chunkings = [[1], [3], [17], [5, 1, 30], [100]] if n <= 300 else [[17], [5, 64, 1000], [4000]]
    prompt_cases(lay, random.Random(n), n, chunkings)
    decode_cases(lay, random.Random(n + 1), n, [1, 2, 7, 33, 64, 255])
