"""The MLA output kernel (engine/kernels/mla_output.py) on CUDA at lite's attention shapes, skipped
without a GPU: o_proj, the residual add and the norm of one launch against cuBLAS's o_proj and the
norm kernel, in bf16; the ticket back at zero after every launch; and, replayed 300 times in a
CUDA graph, the same bits every time (whichever block finishes last normalises the same row).
Run on a GPU machine: pytest tests/engine/test_gpu_mla_output.py"""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

LAYER, SLOTS, MAX_LEN = 1, 8, 1024


def lite_attention():
    from engine.attention import MLAttention
    from engine.config import ModelConfig
    from engine.presets import PRESETS, random_tensor
    from engine.rope import Rope
    from engine.weights import expected_tensors
    cfg = ModelConfig.from_dict(PRESETS["lite"])
    prefix = f"model.layers.{LAYER}.self_attn."
    w = {n: random_tensor(n, s, 0).to(torch.bfloat16).cuda() for n, s in expected_tensors(cfg).items()
         if n.startswith(prefix)}
    attn = MLAttention(cfg, LAYER, w, Rope(cfg, MAX_LEN, device="cuda"))
    attn.use_kernels(decode=True, prefill=False)
    return cfg, attn


def test_output_kernel_matches_the_separate_kernels_and_replays_the_same_bits():
    from engine.cuda_graphs import capture
    from engine.kv_cache import MLACache
    cfg, attn = lite_attention()
    g = torch.Generator(device="cuda").manual_seed(0)
    cache = MLACache(LAYER + 1, SLOTS, MAX_LEN, cfg.cache_width, "cuda", torch.bfloat16)
    cache.data.copy_(torch.randn(cache.data.shape, generator=g, device="cuda"))
    h = cfg.hidden_size
    norm_w = (1 + 0.1 * torch.randn(h, generator=g, device="cuda")).to(torch.bfloat16)
    for rows, positions in ((1, [150]), (1, [0]), (1, [900])):
        pos = torch.tensor(positions, device="cuda")
        slots = torch.arange(rows, device="cuda")
        x = torch.randn(rows, h, generator=g, device="cuda").to(torch.bfloat16)
        res = torch.randn(rows, h, generator=g, device="cuda").to(torch.bfloat16)
        length = 1024
        run = lambda: attn.decode_norm(x, res, norm_w, 1e-6, pos, slots, pos + 1, length, cache)  # noqa: E731
        attn.fused_decode = False
        h_ref, x_ref = run()
        attn.fused_decode = True
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
