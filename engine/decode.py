"""The decode step as one graph-capturable function: every row adds one token, attention is MLA
with absorbed weights over the latent cache, MoE runs without host synchronisation, and the
greedy choice is made on the device. The host only reads back the token ids."""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from engine.kv_cache import MLACache
from engine.model import DeepseekV2
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
    def attend(attn, h: torch.Tensor) -> torch.Tensor:
        return attn.decode_absorbed(h, inp.positions, inp.slots, inp.ctx_lens, inp.length, cache)

    x = F.embedding(inp.token_ids, model.embed)  # [B, H]
    if model.fused_kernels:
        return _decode_fused(model, x, attend)
    for layer in model.layers:
        x = layer.run(x, lambda h, a=layer.attn: attend(a, h))
    return model.head(x)  # [B, V]


def _decode_fused(model: DeepseekV2, x: torch.Tensor, attend) -> torch.Tensor:
    """The same layers with each residual add folded into the next RMSNorm (one Triton launch)."""
    from engine.kernels.rmsnorm import rmsnorm
    eps = model.cfg.rms_norm_eps
    delta = None
    for layer in model.layers:
        with phase("attention"):
            h, x = rmsnorm(x, layer.input_norm, eps, residual=delta)
            delta = attend(layer.attn, h)
        h, x = rmsnorm(delta, layer.post_attn_norm, eps, residual=x)
        delta = layer.mlp(h)
    with phase("lm_head"):
        h, _ = rmsnorm(delta, model.norm, eps, residual=x)
        return F.linear(h, model.lm_head)  # [B, V]
