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
from engine.sampler import argmax_rows
from ep.moe import MoE


@dataclasses.dataclass(slots=True)
class DecodeInputs:
    token_ids: torch.Tensor  # [B] int64
    positions: torch.Tensor  # [B] int64, position of the new token
    slots: torch.Tensor  # [B] int64, KV slot of each row
    ctx_lens: torch.Tensor  # [B] int64, cached tokens after this step (= positions + 1)
    length: int  # static attention bound >= every ctx_len (a bucket, so one graph serves many steps)


@torch.inference_mode()
def decode_step(model: DeepseekV2, inp: DecodeInputs, cache: MLACache, out: torch.Tensor | None = None) -> torch.Tensor:
    """Returns the greedy next token of every row, [B] int64, on the device (written into `out`
    when given: the graphs keep every step's tokens in one place)."""
    if not model.fused_kernels:
        logits = decode_logits(model, inp, cache)
        with phase("sampling"):
            return argmax_rows(logits, out=out)
    from engine.kernels import argmax, head_argmax
    h = _decode_fused(model, inp, cache)  # [B, H] after the final norm
    if h.shape[0] <= head_argmax.MAX_ROWS and head_argmax.fits(model.lm_head):  # the head and the choice in one launch
        with phase("lm_head"):
            return head_argmax.head_argmax(h, model.lm_head, model.argmax_ticket, out=out)
    with phase("lm_head"):
        logits = F.linear(h, model.lm_head)  # [B, V]
    with phase("sampling"):  # one launch (engine/kernels/argmax.py) where its tickets reach
        if logits.shape[0] <= argmax.MAX_ROWS:
            return argmax.argmax(logits, model.argmax_ticket, out=out)
        return argmax_rows(logits, out=out)


@torch.inference_mode()
def decode_logits(model: DeepseekV2, inp: DecodeInputs, cache: MLACache) -> torch.Tensor:
    """[B, V] logits of every row's new token."""
    def attend(attn, h: torch.Tensor) -> torch.Tensor:
        return attn.decode_absorbed(h, inp.positions, inp.slots, inp.ctx_lens, inp.length, cache)

    if model.fused_kernels:
        h = _decode_fused(model, inp, cache)
        with phase("lm_head"):
            return F.linear(h, model.lm_head)  # [B, V]
    x = F.embedding(inp.token_ids, model.embed)  # [B, H]
    for layer in model.layers:
        x = layer.run(x, lambda h, a=layer.attn: attend(a, h))
    return model.head(x)  # [B, V]


def _decode_fused(model: DeepseekV2, inp: DecodeInputs, cache: MLACache) -> torch.Tensor:
    """[B, H]: every row's final norm, ready for the LM head. The same layers as Triton-fused steps:
    each residual add folds into the next RMSNorm, a MoE layer's combine (routes in order, then the
    shared experts) folds in with it, and attention's own output kernel adds and normalises at a few rows (MLAttention.decode_norm). At one row the
    first layer's q/kv_a launch reads the token's embedding row itself (norm_proj's token form)."""
    from engine.kernels.rmsnorm import moe_rmsnorm, rmsnorm
    eps = model.cfg.rms_norm_eps

    def norm(delta, weight: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if delta is None:
            return rmsnorm(x, weight, eps)
        if isinstance(delta, tuple):  # a MoE layer's (routed [T, k, H], shared [T, H])
            return moe_rmsnorm(*delta, weight, eps, residual=x)
        return rmsnorm(delta, weight, eps, residual=x)

    from engine.kernels import norm_proj
    one_row = inp.token_ids.shape[0] <= norm_proj.MAX_ROWS  # the norm in the q/kv_a projection's launch
    embed_in_norm = one_row and norm_proj.EMBED and model.layers[0].attn.fused_decode
    x = None if embed_in_norm else F.embedding(inp.token_ids, model.embed)  # [B, H]
    delta = None  # what the next norm adds to the residual stream
    for layer in model.layers:
        with phase("attention"):
            qkv = None
            if x is None:  # the first layer's launch reads the token's embedding row itself
                qkv, x = norm_proj.norm_proj(None, model.embed, layer.input_norm, eps, layer.attn.q_kv_a,
                                             token=inp.token_ids)
                h = None
            elif one_row and layer.attn.fused_decode:
                qkv, x = norm_proj.norm_proj(delta, x, layer.input_norm, eps, layer.attn.q_kv_a)
                h = None
            else:
                h, x = norm(delta, layer.input_norm, x)
            h, x = layer.attn.decode_norm(h, x, layer.post_attn_norm, eps, inp.positions, inp.slots, inp.ctx_lens,
                                          inp.length, cache, qkv=qkv)
        delta = layer.mlp.parts(h, model.side_stream) if isinstance(layer.mlp, MoE) else layer.mlp.fused(h)
    with phase("lm_head"):
        h, _ = norm(delta, model.norm, x)
    return h
