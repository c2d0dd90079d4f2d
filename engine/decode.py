"""The decode step as one graph-capturable function: every row adds one token, attention is MLA
with absorbed weights over the latent cache, MoE runs without host synchronisation, and the
greedy choice is made on the device. The host only reads back the token ids."""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from engine.kv_cache import MLACache
from engine.model import DeepseekV2, rms_norm
from engine.phases import phase


@dataclasses.dataclass(slots=True)
class DecodeInputs:
    token_ids: torch.Tensor  # [B] int64
    positions: torch.Tensor  # [B] int64, position of the new token
    slots: torch.Tensor  # [B] int64, KV slot of each row
    ctx_lens: torch.Tensor  # [B] int64, cached tokens after this step (= positions + 1)
    length: int  # static attention bound >= every ctx_len (a bucket, so one graph serves many steps)


@torch.inference_mode()
def decode_step(model: DeepseekV2, inp: DecodeInputs, cache: MLACache) -> torch.Tensor:
    """Returns the greedy next token of every row, [B] int64, on the device."""
    logits = decode_logits(model, inp, cache)
    with phase("sampling"):
        return torch.argmax(logits, dim=-1)


@torch.inference_mode()
def decode_logits(model: DeepseekV2, inp: DecodeInputs, cache: MLACache) -> torch.Tensor:
    """[B, V] logits of every row's new token."""
    eps = model.cfg.rms_norm_eps
    x = F.embedding(inp.token_ids, model.embed)  # [B, H]
    if model.fused_kernels:
        return _decode_fused(model, inp, cache, x, eps)
    for layer in model.layers:
        with phase("attention"):
            h = rms_norm(x, layer.input_norm, eps)
            x = x + layer.attn.decode_absorbed(h, inp.positions, inp.slots, inp.ctx_lens, inp.length, cache)
        x = x + layer.mlp(rms_norm(x, layer.post_attn_norm, eps))
    with phase("lm_head"):
        return F.linear(rms_norm(x, model.norm, eps), model.lm_head)  # [B, V]


def _decode_fused(model: DeepseekV2, inp: DecodeInputs, cache: MLACache, x: torch.Tensor, eps: float) -> torch.Tensor:
    """The same layers with each residual add folded into the next RMSNorm (one Triton launch)."""
    from engine.kernels.rmsnorm import rmsnorm
    delta = None
    for layer in model.layers:
        with phase("attention"):
            h, x = rmsnorm(x, layer.input_norm, eps, residual=delta)
            delta = layer.attn.decode_absorbed(h, inp.positions, inp.slots, inp.ctx_lens, inp.length, cache)
        h, x = rmsnorm(delta, layer.post_attn_norm, eps, residual=x)
        delta = layer.mlp(h)
    with phase("lm_head"):
        h, _ = rmsnorm(delta, model.norm, eps, residual=x)
        return F.linear(h, model.lm_head)  # [B, V]
