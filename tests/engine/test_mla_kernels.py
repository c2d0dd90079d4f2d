"""The fused MLA decode (one q/kv_a GEMV, the prep kernel, the split kernel, the merge kernel with
W_UV) computes what the torch form of MLAttention.decode_absorbed computes: the same absorbed query,
the same cache entries at exactly the (slot, position) of each row and nowhere else, the same output.
Run by Triton's CPU interpreter in a subprocess (the same code runs compiled on the GPU)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import torch
from engine.attention import MLAttention
from engine.config import ModelConfig
from engine.kernels import mla_output
from engine.kv_cache import MLACache
from engine.presets import preset_config, random_tensor
from engine.rope import Rope
from engine.weights import expected_tensors

LAYER, SLOTS, MAX_LEN = 1, 20, 320


def attention(overrides: dict, dtype: torch.dtype, grain: torch.dtype | None = None) -> tuple[ModelConfig, MLAttention]:
    # the tiny preset's head structure (nh 4, nope 16, rope 8 with YaRN, rank 32, v 16) or overrides;
    # weights drawn in float32, rounded to `grain` (default: dtype), held in dtype
    cfg = ModelConfig.from_dict({**preset_config("tiny"), **overrides}, "test")
    prefix = f"model.layers.{LAYER}.self_attn."
    w = {n: random_tensor(n, s, 0).to(grain or dtype).to(dtype)
         for n, s in expected_tensors(cfg).items() if n.startswith(prefix)}
    attn = MLAttention(cfg, LAYER, w, Rope(cfg, MAX_LEN))
    attn.use_kernels(decode=True, prefill=False)  # the output kernel's tickets; `both` picks the path
    return cfg, attn


def both(attn: MLAttention, run, cache: MLACache) -> tuple:
    # (torch result, fused result, torch cache, fused cache), each form on its own copy of `cache`
    out = []
    for fused in (False, True):
        attn.fused_decode = fused
        c = copy(cache)
        out.append((run(c), c.data))
    attn.fused_decode = False
    return out[0][0], out[1][0], out[0][1], out[1][1]


def copy(cache: MLACache, dtype: torch.dtype | None = None) -> MLACache:
    c = MLACache(cache.data.shape[0], SLOTS, MAX_LEN, cache.data.shape[-1], "cpu", dtype or cache.data.dtype)
    c.data.copy_(cache.data)
    return c


def same(got: torch.Tensor, want: torch.Tensor) -> None:
    # float32: only the summation order differs. bf16: the same roundings of float32 values that
    # differ in their last bits, so a rare entry is one rounding step (2^-8 relative) off; a missing
    # or extra rounding would move far more of them
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        return
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-5)
    assert (got != want).float().mean() < 0.01, (got != want).float().mean()


def check(overrides: dict, dtype: torch.dtype, positions: list[int], seed: int) -> None:
    cfg, attn = attention(overrides, dtype)
    g = torch.Generator().manual_seed(seed)
    cache = MLACache(LAYER + 1, SLOTS, MAX_LEN, cfg.cache_width, "cpu", dtype)
    cache.data.copy_(torch.randn(cache.data.shape, generator=g))  # stale entries everywhere
    b = len(positions) + 1  # the last row is CUDA-graph padding: the scratch slot, position 0, length 1
    pos = torch.tensor(positions + [0])  # [B]
    slots = torch.cat([torch.randperm(SLOTS, generator=g)[:b - 1], torch.tensor([cache.scratch_slot])])  # [B]
    ctx = pos + 1  # [B]
    x = torch.randn(b, cfg.hidden_size, generator=g).to(dtype)  # [B, H]
    length = max(positions) + 17  # static bound, not a multiple of anything
    q_ref, q_got, c_ref, c_got = both(attn, lambda c: attn.absorbed_query(x, pos, slots, c), cache)
    assert q_got.shape == (b, cfg.num_attention_heads, cfg.cache_width) and q_got.dtype == dtype
    same(q_got, q_ref)
    touched = torch.zeros(cache.data.shape[:3], dtype=torch.bool)  # [L, S+1, N]
    touched[LAYER, slots, pos] = True
    assert torch.equal(c_got[~touched], cache.data[~touched]), "the prep kernel wrote outside (slot, position)"
    assert not torch.equal(c_ref[touched], cache.data[touched])
    same(c_got[touched], c_ref[touched])

    run = lambda a, c, x: a.decode_absorbed(x, pos, slots, ctx, length, c)  # noqa: E731
    o_ref, o_got, _, _ = both(attn, lambda c: run(attn, c, x), cache)
    assert o_got.shape == (b, cfg.hidden_size) and o_got.dtype == dtype
    rel = lambda o, want: float((o.float() - want.float()).norm() / want.float().norm())  # noqa: E731
    if dtype == torch.float32:
        torch.testing.assert_close(o_got, o_ref, rtol=1e-4, atol=1e-4)
    else:
        # no closer to the torch path than rounding allows: judge both against float32 arithmetic
        # on the same bf16 values; the fused path must be as accurate as the torch path
        _, exact = attention(overrides, torch.float32, grain=dtype)
        want = run(exact, copy(cache, torch.float32), x.float())  # [B, H]
        assert rel(o_got, want) < 1.5 * rel(o_ref, want), (rel(o_got, want), rel(o_ref, want))
        assert rel(o_got, o_ref) < 1e-2, rel(o_got, o_ref)
    print(dtype, overrides, "q", float((q_got.float() - q_ref.float()).abs().max()), "out", rel(o_got, o_ref))

    # the output kernel (engine/kernels/mla_output.py): o_proj, residual add and the post-attention
    # norm in one launch at up to MAX_ROWS rows (the torch form: decode_absorbed, then the norm
    # kernel); its ticket is back at zero after every launch
    res = torch.randn(b, cfg.hidden_size, generator=g).to(dtype)  # [B, H]
    norm_w = (1 + 0.1 * torch.randn(cfg.hidden_size, generator=g)).to(dtype)
    rows = mla_output.MAX_ROWS
    args = (norm_w, 1e-6, pos[:rows], slots[:rows], ctx[:rows], length)
    (h_ref, x_ref), (h_got, x_got), _, _ = both(attn, lambda c: attn.decode_norm(x[:rows], res[:rows], *args, c), cache)
    assert h_got.shape == x_got.shape == (rows, cfg.hidden_size) and h_got.dtype == dtype
    assert not attn.out_count.any()
    if dtype == torch.float32:
        torch.testing.assert_close(x_got, x_ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(h_got, h_ref, rtol=1e-4, atol=1e-4)
    else:  # o_proj's float32 sums in another order: a rounding step apart where they differ
        assert rel(x_got, x_ref) < 1e-2 and rel(h_got, h_ref) < 1e-2, (rel(x_got, x_ref), rel(h_got, h_ref))
    print(dtype, "rows", rows, "norm", rel(h_got, h_ref))


def interpreter_bf16_as_gpu() -> None:
    # The interpreter keeps bfloat16 as its uint16 bits and does not support bf16 arithmetic
    # (triton-lang/triton#11584: its tl.dot multiplies the bits; "we just don't support it yet"), and
    # it narrows float32 to bf16 by truncation where the GPU rounds to nearest even. These kernels
    # widen every other bf16 value to float32 before arithmetic; for the rest, do what the GPU does:
    # widen tl.dot's operands exactly (bits << 16, so float32 products and accumulation) and narrow
    # float32 -> bf16 to nearest even (through torch).
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as ti
    dot, cast = ti.InterpreterBuilder.create_dot, ti.InterpreterBuilder.cast_impl

    def widen(t):
        if t.dtype.scalar != tl.bfloat16:
            return t
        return ti.TensorHandle((t.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def narrow(self, src, dst_type):
        if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.bfloat16:
            return cast(self, src, dst_type)
        bits = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16).view(torch.int16).numpy()
        return ti.TensorHandle(bits.view(np.uint16), tl.bfloat16)

    ti.InterpreterBuilder.create_dot = lambda self, a, b, d, *rest: dot(self, widen(a), widen(b), d, *rest)
    ti.InterpreterBuilder.cast_impl = narrow


# float32: 17 rows at ragged positions over two 256-long splits (some rows end in the first split,
# one is at position 0) plus the padding row; two row blocks of the prep and merge kernels
check({}, torch.float32, [5, 0, 290, 17, 255, 256, 3, 100, 299, 42, 8, 1, 64, 128, 200, 31, 77], 0)
# the q LoRA path (its norm and q_b stay in torch; a non-power-of-two q rank)
check({"q_lora_rank": 24}, torch.float32, [5, 0, 290], 1)
# non-power-of-two head dims: the kernels pad and mask
check({"qk_nope_head_dim": 12, "qk_rope_head_dim": 6, "kv_lora_rank": 40, "v_head_dim": 20}, torch.float32,
      [9, 0, 33], 2)
# bfloat16, with the interpreter doing bf16 as the GPU does (above)
interpreter_bf16_as_gpu()
check({}, torch.bfloat16, [5, 0, 290], 3)
print("ok")
"""


def test_fused_mla_decode_matches_torch_path_in_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout[-2000:] + p.stderr[-3000:]
