"""The MLA attention cases the mla_prep, mla_decode and mla_output tests share: one layer of the tiny
preset's head structure (or overrides), built twice over the same weights, once with the Triton
kernels (KernelConfig's default) and once without (the torch path), and a batch of rows at ragged
positions over a cache of stale entries, the last row CUDA-graph padding."""
from __future__ import annotations

import dataclasses

import torch

from pegainfer.engine.config import ModelConfig
from pegainfer.engine.kernels.config import KernelConfig
from pegainfer.engine.kv_cache import MLACache
from pegainfer.engine.model.attention import MLAttention
from pegainfer.engine.model.inputs import DecodeInputs
from pegainfer.engine.model.rope import Rope
from pegainfer.engine.presets import preset_config, random_tensor
from pegainfer.engine.weights import expected_tensors

LAYER, SLOTS, MAX_LEN = 1, 20, 320
FUSED, TORCH = KernelConfig(), KernelConfig(triton=False)

# (overrides, dtype, positions, seed). float32: 17 rows at ragged positions over two 256-long
# splits (some rows end in the first split, one is at position 0) plus the padding row, two row
# blocks of the prep and merge kernels; the q LoRA path (its norm and q_b stay in torch; a
# non-power-of-two q rank); non-power-of-two head dims (the kernels pad and mask); bfloat16 (with
# the interpreter doing bf16 as the GPU does: the bf16_as_gpu fixture)
CASES = [({}, torch.float32, [5, 0, 290, 17, 255, 256, 3, 100, 299, 42, 8, 1, 64, 128, 200, 31, 77], 0),
         ({"q_lora_rank": 24}, torch.float32, [5, 0, 290], 1),
         ({"qk_nope_head_dim": 12, "qk_rope_head_dim": 6, "kv_lora_rank": 40, "v_head_dim": 20}, torch.float32,
          [9, 0, 33], 2),
         ({}, torch.bfloat16, [5, 0, 290], 3)]
IDS = ["f32-17rows", "f32-q-lora", "f32-odd-dims", "bf16"]


def attention(overrides: dict, dtype: torch.dtype, kernels: KernelConfig,
              grain: torch.dtype | None = None) -> tuple[ModelConfig, MLAttention]:
    """Weights drawn in float32, rounded to `grain` (default: dtype), held in dtype."""
    cfg = ModelConfig.from_dict({**preset_config("tiny"), **overrides}, "test")
    prefix = f"model.layers.{LAYER}.self_attn."
    w = {n: random_tensor(n, s, 0).to(grain or dtype).to(dtype)
         for n, s in expected_tensors(cfg).items() if n.startswith(prefix)}
    return cfg, MLAttention(cfg, LAYER, w, Rope(cfg, MAX_LEN), kernels)


@dataclasses.dataclass
class Case:
    cfg: ModelConfig
    torch_attn: MLAttention
    fused_attn: MLAttention
    cache: MLACache  # stale entries everywhere
    inp: DecodeInputs
    x: torch.Tensor  # [B, H] the rows' normed input
    gen: torch.Generator

    def both(self, run) -> tuple:
        """(torch result, fused result, torch cache, fused cache): run(attention, cache) on each form,
        each on its own copy of the cache."""
        out = []
        for attn in (self.torch_attn, self.fused_attn):
            c = copy(self.cache)
            out.append((run(attn, c), c.data))
        return out[0][0], out[1][0], out[0][1], out[1][1]


def case(overrides: dict, dtype: torch.dtype, positions: list[int], seed: int) -> Case:
    cfg, torch_attn = attention(overrides, dtype, TORCH)
    _, fused_attn = attention(overrides, dtype, FUSED)
    g = torch.Generator().manual_seed(seed)
    cache = MLACache(LAYER + 1, SLOTS, MAX_LEN, cfg.cache_width, "cpu", dtype)
    cache.data.copy_(torch.randn(cache.data.shape, generator=g))
    # every slot's pages scattered over the pool (the scratch slot's row stays on the scratch page)
    cache.table[:SLOTS] = torch.randperm(cache.num_pages, generator=g).view(SLOTS, -1).to(torch.int32)
    b = len(positions) + 1  # the last row is CUDA-graph padding: the scratch slot, position 0, length 1
    pos = torch.tensor(positions + [0])  # [B]
    slots = torch.cat([torch.randperm(SLOTS, generator=g)[:b - 1], torch.tensor([cache.scratch_slot])])  # [B]
    x = torch.randn(b, cfg.hidden_size, generator=g).to(dtype)  # [B, H]
    length = max(positions) + 17  # static bound, not a multiple of anything
    return Case(cfg, torch_attn, fused_attn, cache, DecodeInputs(x.new_zeros(b, dtype=torch.int64), pos, slots, pos + 1,
                                                                    length), x, g)


def copy(cache: MLACache, dtype: torch.dtype | None = None) -> MLACache:
    c = MLACache(cache.data.shape[0], SLOTS, MAX_LEN, cache.data.shape[-1], "cpu", dtype or cache.data.dtype)
    c.data.copy_(cache.data)
    c.table.copy_(cache.table)
    return c


def same(got: torch.Tensor, want: torch.Tensor) -> None:
    """float32: only the summation order differs. bf16: the same roundings of float32 values that
    differ in their last bits, so a rare entry is one rounding step (2^-8 relative) off; a missing
    or extra rounding would move far more of them."""
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        return
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-5)
    assert (got != want).float().mean() < 0.01, (got != want).float().mean()


def rel(o: torch.Tensor, want: torch.Tensor) -> float:
    return float((o.float() - want.float()).norm() / want.float().norm())
