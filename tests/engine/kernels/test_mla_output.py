"""engine/kernels/mla_output.py: the end of an MLA decode layer in one launch (o_proj, the residual
add and the post-attention RMSNorm) at up to KernelConfig.mla_output_rows rows, through the
attention (MLAttention.decode_norm) against the torch path (decode_absorbed, then the add and the
norm), the ticket back at zero after every launch: Triton's CPU interpreter. On the GPU at lite's
attention shapes in bf16 against the torch path, and the same bits on each of 300 replays of a CUDA
graph (whichever block finishes last normalises the same row)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.engine.kernels.config import KernelConfig  # noqa: E402
from tests.engine.kernels import mla_cases  # noqa: E402


@pytest.mark.parametrize("overrides,dtype,positions,seed", mla_cases.CASES, ids=mla_cases.IDS)
def test_output_kernel_matches_the_torch_path(triton_interpreter, request, overrides, dtype, positions, seed):
    if dtype == torch.bfloat16:
        request.getfixturevalue("bf16_as_gpu")
    c = mla_cases.case(overrides, dtype, positions, seed)
    rows = mla_cases.FUSED.mla_output_rows
    res = torch.randn(c.x.shape[0], c.cfg.hidden_size, generator=c.gen).to(dtype)  # [B, H]
    norm_w = (1 + 0.1 * torch.randn(c.cfg.hidden_size, generator=c.gen)).to(dtype)
    inp = c.inp
    first = type(inp)(inp.token_ids[:rows], inp.positions[:rows], inp.slots[:rows], inp.ctx_lens[:rows], inp.length)
    (h_ref, x_ref), (h_got, x_got), _, _ = c.both(
        lambda attn, cache: attn.decode_norm(c.x[:rows], res[:rows], norm_w, 1e-6, first, cache))
    assert h_got.shape == x_got.shape == (rows, c.cfg.hidden_size) and h_got.dtype == dtype
    assert not c.fused_attn.out_count.any()
    if dtype == torch.float32:
        torch.testing.assert_close(x_got, x_ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(h_got, h_ref, rtol=1e-4, atol=1e-4)
    else:  # o_proj's float32 sums in another order: a rounding step apart where they differ
        rel = mla_cases.rel
        assert rel(x_got, x_ref) < 1e-2 and rel(h_got, h_ref) < 1e-2, (rel(x_got, x_ref), rel(h_got, h_ref))


def test_output_kernel_runs_up_to_its_rows_only(triton_interpreter, monkeypatch):
    """Above mla_output_rows rows decode_norm takes the separate launches; at 0 it never launches."""
    from pegainfer.engine.kernels import mla_output
    calls = []
    real = mla_output.proj_norm
    monkeypatch.setattr(mla_output, "proj_norm", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    for rows_limit, batches, want in ((1, (1, 2), [1]), (0, (1,), [])):
        c = mla_cases.case({}, torch.float32, [5, 9], 0)
        _, attn = mla_cases.attention({}, torch.float32, KernelConfig(mla_output_rows=rows_limit))
        calls.clear()
        for b in batches:
            inp = type(c.inp)(c.inp.token_ids[:b], c.inp.positions[:b], c.inp.slots[:b], c.inp.ctx_lens[:b], c.inp.length)
            attn.decode_norm(c.x[:b], c.x[:b], torch.ones(c.cfg.hidden_size), 1e-6, inp, mla_cases.copy(c.cache))
        assert calls == want, rows_limit


LAYER, SLOTS, MAX_LEN = 1, 8, 1024


def _lite_attention(kernels: KernelConfig):
    from pegainfer.engine.config import ModelConfig
    from pegainfer.engine.model.attention import MLAttention
    from pegainfer.engine.model.rope import Rope
    from pegainfer.engine.presets import PRESETS, random_tensor
    from pegainfer.engine.weights import expected_tensors
    cfg = ModelConfig.from_dict(PRESETS["lite"])
    prefix = f"model.layers.{LAYER}.self_attn."
    w = {n: random_tensor(n, s, 0).to(torch.bfloat16).cuda() for n, s in expected_tensors(cfg).items()
         if n.startswith(prefix)}
    return cfg, MLAttention(cfg, LAYER, w, Rope(cfg, MAX_LEN, device="cuda"), kernels)


def test_gpu_output_kernel_matches_the_torch_path_and_replays_the_same_bits(triton_gpu):
    from pegainfer.engine.cuda_graphs import capture
    from pegainfer.engine.kv_cache import MLACache
    from pegainfer.engine.model.inputs import DecodeInputs
    cfg, attn = _lite_attention(KernelConfig())
    _, ref_attn = _lite_attention(KernelConfig(triton=False))
    g = torch.Generator(device="cuda").manual_seed(0)
    cache = MLACache(LAYER + 1, SLOTS, MAX_LEN, cfg.cache_width, "cuda", torch.bfloat16)
    cache.data.copy_(torch.randn(cache.data.shape, generator=g, device="cuda"))
    h = cfg.hidden_size
    norm_w = (1 + 0.1 * torch.randn(h, generator=g, device="cuda")).to(torch.bfloat16)
    for rows, positions in ((1, [150]), (1, [0]), (1, [900])):
        pos = torch.tensor(positions, device="cuda")
        inp = DecodeInputs(pos, pos, torch.arange(rows, device="cuda"), pos + 1, 1024)
        x = torch.randn(rows, h, generator=g, device="cuda").to(torch.bfloat16)
        res = torch.randn(rows, h, generator=g, device="cuda").to(torch.bfloat16)
        h_ref, x_ref = ref_attn.decode_norm(x, res, norm_w, 1e-6, inp, cache)
        run = lambda: attn.decode_norm(x, res, norm_w, 1e-6, inp, cache)  # noqa: E731
        h_got, x_got = run()
        assert not attn.out_count.any()
        rel = lambda a, b: float((a.float() - b.float()).norm() / b.float().norm())  # noqa: E731
        assert rel(x_got, x_ref) < 1e-2 and rel(h_got, h_ref) < 1e-2, (rows, rel(x_got, x_ref), rel(h_got, h_ref))
        graph, out = capture(run, None)
        graph.replay()
        torch.cuda.synchronize()
        first = [t.clone() for t in out]
        for _ in range(300):
            graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(first, out)), rows
        assert torch.equal(first[0], h_got) and torch.equal(first[1], x_got), rows
        assert not attn.out_count.any()
