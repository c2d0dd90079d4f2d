"""The batch-invariance cases of MLA attention outside the decode kernel, shared by the CPU test
(tests/engine/test_attention_invariance.py, tiny shapes, float32 and bfloat16, the torch form and the
Triton form in the interpreter) and its GPU variant (lite shapes, bfloat16, compiled): one attention
layer over a cache, a prompt's per-token outputs and cached latents computed alone, packed beside
other prompts at other offsets (MLAttention.prefill_packed), cut into chunks over the cache
(MLAttention.__call__), and decode rows beside rows of other lengths."""
from __future__ import annotations

import dataclasses
import random

import torch

from pegainfer.engine.batch import Batch, RowInput
from pegainfer.engine.config import ModelConfig
from pegainfer.engine.kernels.config import KernelConfig
from pegainfer.engine.kv_cache import MLACache
from pegainfer.engine.model.attention import MLAttention
from pegainfer.engine.model.rope import Rope
from pegainfer.engine.presets import preset_config, random_tensor
from pegainfer.engine.weights import expected_tensors

LAYER = 1


@dataclasses.dataclass
class Layer:
    attn: MLAttention
    cache: MLACache
    hidden: int
    device: torch.device
    dtype: torch.dtype
    gen: torch.Generator

    def x(self, n: int) -> torch.Tensor:
        """[n, H] random normed inputs."""
        return torch.randn(n, self.hidden, generator=self.gen).to(self.dtype).to(self.device)

    def latents(self, slot: int, n: int) -> torch.Tensor:
        return self.cache.read(LAYER, slot, n).clone()

    def packed(self, prompts: list[tuple[int, torch.Tensor]]) -> list[torch.Tensor]:
        """Fresh prompts (slot, x [n, H]) packed back to back in this order -> each one's [n, H]."""
        xs = torch.cat([x for _, x in prompts])
        pos = torch.cat([torch.arange(x.shape[0]) for _, x in prompts]).to(self.device)
        slots = torch.cat([torch.full((x.shape[0],), s) for s, x in prompts]).to(self.device)
        row = torch.cat([torch.full((x.shape[0],), i) for i, (_, x) in enumerate(prompts)]).to(self.device)
        one = len(prompts) == 1  # as engine/model/prefill.py: plain causal, or SDPA's [1, 1, T, T] mask
        mask = None if one else ((row[:, None] == row[None, :]) & (pos[None, :] <= pos[:, None]))[None, None]
        out = self.attn.prefill_packed(xs, pos, slots, mask, self.cache, one_prompt=one)
        return list(out.split([x.shape[0] for _, x in prompts]))

    def rows(self, rows: list[tuple[int, torch.Tensor, int]]) -> list[torch.Tensor]:
        """Rows (slot, x [n, H], start position) over the cache in one reference call -> each one's [n, H]."""
        batch = Batch.build([RowInput(s, [0] * x.shape[0], p) for s, x, p in rows], self.device)
        out = self.attn(torch.cat([x for _, x, _ in rows]), batch, self.cache)
        return list(out.split([x.shape[0] for _, x, _ in rows]))

    def fill(self, slot: int, n: int) -> None:
        """Random latents at a slot's first n positions (a decode row's earlier context)."""
        width = self.cache.data.shape[-1]
        values = torch.randn(n, width, generator=self.gen).to(self.dtype).to(self.device)
        self.cache.write(LAYER, torch.full((n,), slot, device=self.device), torch.arange(n, device=self.device), values)


def layer(preset: str, dtype: torch.dtype, kernels: KernelConfig, *, device: str = "cpu", max_len: int = 320,
          slots: int = 24, overrides: dict | None = None, seed: int = 0) -> Layer:
    """One attention layer of `preset` (weights drawn in float32, held in dtype) over a cache of
    stale entries."""
    cfg = ModelConfig.from_dict({**preset_config(preset), **(overrides or {})}, "test")
    prefix = f"model.layers.{LAYER}.self_attn."
    w = {n: random_tensor(n, s, 0).to(dtype).to(device) for n, s in expected_tensors(cfg).items()
         if n.startswith(prefix)}
    attn = MLAttention(cfg, LAYER, w, Rope(cfg, max_len, device), kernels)
    g = torch.Generator().manual_seed(seed)
    cache = MLACache(LAYER + 1, slots, max_len, cfg.cache_width, device, dtype)
    cache.data.copy_(torch.randn(cache.data.shape, generator=g).to(dtype))
    # every slot's pages scattered over the pool: the attention finds them through the page table
    perm = torch.randperm(cache.num_pages, generator=g).view(slots, -1)
    cache.table[:slots] = perm.to(torch.int32).to(cache.table.device)
    return Layer(attn, cache, cfg.hidden_size, torch.device(device), dtype, g)


def chunked(lay: Layer, slot: int, x: torch.Tensor, sizes: list[int],
            beside: list[tuple[int, torch.Tensor, int]] = ()) -> torch.Tensor:
    """The prompt x cut into chunks of `sizes` (cycled), each a reference call over the cache, the
    first from position 0; `beside`: other rows (slot, x, start) that join every call -> [n, H]."""
    out, start, i = [], 0, 0
    while start < x.shape[0]:
        n = min(sizes[i % len(sizes)], x.shape[0] - start)
        out.append(lay.rows([(slot, x[start:start + n], start), *beside])[0])
        start, i = start + n, i + 1
    return torch.cat(out)


def prompt_cases(lay: Layer, rnd: random.Random, n: int, chunkings: list[list[int]]) -> None:
    """The prompt at slot 0 alone (packed path) against every other way to compute it."""
    x = lay.x(n)
    alone = lay.packed([(0, x)])[0]
    latents = lay.latents(0, n)

    def check(got, what):
        equal(got, alone, what)
        equal(lay.latents(0, n), latents, f"{what} (latents)")
        lay.fill(0, n)  # stale values where the next form must write

    lay.fill(0, n)
    check(lay.rows([(0, x, 0)])[0], "reference from position 0")
    for others in range(1, 6):
        pack = [(1 + i, lay.x(rnd.randint(1, 90))) for i in range(others)]
        at = rnd.randint(0, others)
        pack.insert(at, (0, x))
        check(lay.packed(pack)[at], f"packed at {at} of {others + 1}")
    for sizes in chunkings:
        beside = []
        for i in range(rnd.randint(0, 4)):  # decode rows of other lengths and another prompt's chunk
            ctx = rnd.randint(1, 300)
            lay.fill(10 + i, ctx)
            beside.append((10 + i, lay.x(1), ctx - 1))
        if rnd.random() < 0.5:
            beside.insert(rnd.randint(0, len(beside)), (15, lay.x(rnd.randint(2, 40)), rnd.randint(0, 100)))
        check(chunked(lay, 0, x, sizes, beside), f"chunks of {sizes} beside {len(beside)} rows")


def decode_cases(lay: Layer, rnd: random.Random, ctx: int, crowds: list[int]) -> None:
    """A decode row at position ctx - 1 (slot 0) alone against crowds of rows of other lengths, in
    random places, with prompt chunks among them."""
    lay.fill(0, ctx - 1)
    x = lay.x(1)
    alone = lay.rows([(0, x, ctx - 1)])[0]
    latent = lay.latents(0, ctx)
    for size in crowds:
        rows = []
        for i in range(size):
            if rnd.random() < 0.2:  # a prompt chunk
                rows.append((1 + i, lay.x(rnd.randint(2, 30)), rnd.randint(0, 150)))
            else:
                top = lay.cache.max_len
                other = rnd.choice([1, 2, max(ctx - 1, 1), min(ctx + 1, top), rnd.randint(1, top)])
                lay.fill(1 + i, other)
                rows.append((1 + i, lay.x(1), other - 1))
        at = rnd.randint(0, size)
        rows.insert(at, (0, x, ctx - 1))
        equal(lay.rows(rows)[at], alone, f"decode row at {at} of {size + 1}")
        equal(lay.latents(0, ctx), latent, "decode latent")


def equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert torch.equal(got, want), f"{what}: {(got != want).sum().item()} of {want.numel()} differ, " \
                                   f"max {(got.float() - want.float()).abs().max().item():.3g}"
