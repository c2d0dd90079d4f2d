"""The decode step as one graph-capturable function: every row adds one token, attention is MLA
with absorbed weights over the latent cache, MoE runs without host synchronisation, and the greedy
choice is made on the device. The host only reads back the token ids.

One function for the phase; the model's KernelConfig selects inside it. With the Triton kernels
(`triton`) each residual add folds into the next RMSNorm's launch, a MoE layer's combine (routes in
order, then the shared experts) folds in with it, attention's output kernel adds and normalises at
up to `mla_output_rows` rows (MLAttention.decode_norm), the layer input's norm runs inside the q/kv_a
projection's launch at up to `norm_proj_rows` rows (layer 0's reading its embedding row itself with
`embed_in_norm`), and the LM head with the argmax is one launch at up to `head_argmax_rows` rows, the
argmax alone one launch at up to `argmax_rows`. In batch-invariant mode those one-row launches are
off, unless `norm_linear_rows` puts the layer input and attention's output in one launch each at one
row with the multi-row path's bits (engine/kernels/norm_linear.py; the two norms then take their sum
of squares as a dot product at every row count). Without them every step is the reference's torch op."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pegainfer.engine.kv_cache import MLACache
from pegainfer.engine.model.inputs import DecodeInputs
from pegainfer.engine.model.model import DeepseekV2
from pegainfer.engine.model.norm import add_norm
from pegainfer.engine.phases import phase
from pegainfer.engine.sampler import argmax_rows


@torch.inference_mode()
def decode_step(model: DeepseekV2, inp: DecodeInputs, cache: MLACache, out: torch.Tensor | None = None) -> torch.Tensor:
    """Returns the greedy next token of every row, [B] int64, on the device (written into `out`
    when given: the graphs keep every step's tokens in one place)."""
    k = model.kernels
    h = decode_hidden(model, inp, cache)  # [B, H] after the final norm
    rows = h.shape[0]
    if k.triton and rows <= k.head_argmax_rows:
        from pegainfer.engine.kernels import head_argmax
        if head_argmax.fits(model.lm_head, k.head):  # the head and the choice in one launch
            with phase("lm_head"):
                return head_argmax.head_argmax(h, model.lm_head, model.argmax_ticket, k.head, out=out,
                                               round_logits=not k.float32_logits)
    with phase("lm_head"):
        logits = model.logits(h)  # [B, V]
    with phase("sampling"):
        if k.triton and rows <= k.argmax_rows:  # one launch (engine/kernels/argmax.py) where its tickets reach
            from pegainfer.engine.kernels import argmax
            return argmax.argmax(logits, model.argmax_ticket, out=out)
        return argmax_rows(logits, out=out)


@torch.inference_mode()
def decode_logits(model: DeepseekV2, inp: DecodeInputs, cache: MLACache) -> torch.Tensor:
    """[B, V] logits of every row's new token."""
    h = decode_hidden(model, inp, cache)
    with phase("lm_head"):
        return model.logits(h)  # [B, V]


def decode_hidden(model: DeepseekV2, inp: DecodeInputs, cache: MLACache) -> torch.Tensor:
    """[B, H]: every row's final norm, ready for the LM head."""
    k = model.kernels
    eps = model.cfg.rms_norm_eps
    # the layer input's norm inside the q/kv_a projection's launch (engine/kernels/norm_proj.py; in
    # batch-invariant mode, with norm_linear_rows, engine/kernels/norm_linear.py and its dot-product
    # norm at every row count)
    rows = inp.token_ids.shape[0]
    dot = k.triton and k.batch_invariant and k.norm_linear_rows > 0
    one_row = k.triton and rows <= (k.norm_linear_rows if dot else k.norm_proj_rows)
    embed_in_norm = one_row and k.embed_in_norm and model.layers[0].attn.fused_decode
    x = None if embed_in_norm else F.embedding(inp.token_ids, model.embed)  # [B, H]
    delta = None  # what the next norm adds to the residual stream
    for layer in model.layers:
        with phase("attention"):
            qkv, h = None, None
            if one_row and (x is None or layer.attn.fused_decode):
                # x None: the first layer's launch reads the token's embedding row itself
                qkv, x = _norm_q_kv_a(model, layer, delta, x, inp.token_ids, dot)
            elif dot:
                from pegainfer.engine.kernels.norm_linear import dot_norm
                h, x = dot_norm(delta, x, layer.input_norm, eps, k.linear)
            else:
                h, x = add_norm(delta, layer.input_norm, x, eps, k.triton, k)
            h, x = layer.attn.decode_norm(h, x, layer.post_attn_norm, eps, inp, cache, qkv=qkv)
        delta = layer.mlp_decode(h, model.side_stream)
    with phase("lm_head"):
        h, _ = add_norm(delta, model.norm, x, eps, k.triton, k)
    return h


def _norm_q_kv_a(model: DeepseekV2, layer, delta, x: torch.Tensor | None, token_ids: torch.Tensor,
                 dot: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One row's layer input (x plus delta; x None: the token's embedding row), its norm and the q/kv_a
    projection in one launch: (q_kv_a [1, N], the residual row [1, H])."""
    k, eps = model.kernels, model.cfg.rms_norm_eps
    table, token = (model.embed, token_ids) if x is None else (x, None)
    if dot:
        from pegainfer.engine.kernels.norm_linear import norm_linear
        return norm_linear(delta, table, layer.input_norm, eps, layer.attn.q_kv_a, k.linear, block_n=k.norm_linear_n,
                           num_warps=k.norm_linear_warps, token=token)
    from pegainfer.engine.kernels.norm_proj import norm_proj
    return norm_proj(delta, table, layer.input_norm, eps, layer.attn.q_kv_a, k.norm_proj, token=token)
