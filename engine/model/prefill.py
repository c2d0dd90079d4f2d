"""The prefill step for packed prompts as one graph-capturable function (fresh ones; with
KernelConfig.batch_invariant also prompts continuing a cached prefix or an earlier chunk, their keys
gathered from the paged cache: PrefillInputs.bank_index): every prompt's tokens packed
into one sequence, attention kept inside each prompt, MoE without host synchronisation, and the
greedy choice for each prompt's last token on the device (or, for steps that sample, the logits of
each prompt's last token). One function for the phase; inside it attention is the Triton
packed-prompt kernel with the model's KernelConfig `triton` (CUDA), else SDPA under a mask built on
the device, or plain causal attention for a pack of one prompt. With KernelConfig.batch_invariant
every pack takes the batch-invariant attention (MLAttention.prefill_packed): the Triton
`prompt_attention`, graph-safe, or the blocked torch form, which reads the pack's prompts on the host
(so the prefill graphs leave it to the eager path: PrefillGraphs.fits)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pegainfer.engine.kv_cache import MLACache
from pegainfer.engine.model.inputs import PrefillInputs
from pegainfer.engine.model.model import DeepseekV2
from pegainfer.engine.phases import phase
from pegainfer.engine.sampler import argmax_rows


@torch.inference_mode()
def prefill_step(model: DeepseekV2, inp: PrefillInputs, cache: MLACache, one_prompt: bool = False) -> torch.Tensor:
    """Returns the greedy next token of every prompt, [R] int64, on the device."""
    logits = prefill_logits(model, inp, cache, one_prompt)
    with phase("sampling"):
        return argmax_rows(logits)


@torch.inference_mode()
def prefill_logits(model: DeepseekV2, inp: PrefillInputs, cache: MLACache, one_prompt: bool = False) -> torch.Tensor:
    """[R, V] logits of every prompt's last token. one_prompt: the pack holds one prompt (from index
    0, padding after it), so plain causal attention is exact and no T x T mask is built; nor is it
    where the Triton packed-prompt kernel runs."""
    mask = None
    attn = model.layers[0].attn
    if not (one_prompt or attn.fused_prefill or attn.invariant):  # the batch-invariant forms need no mask
        same_row = inp.row_ids[:, None] == inp.row_ids[None, :]  # [T, T]
        causal = inp.positions[None, :] <= inp.positions[:, None]  # [T, T] key position <= query position
        mask = (same_row & causal)[None, None]  # [1, 1, T, T]
    x = F.embedding(inp.token_ids, model.embed)  # [T, H]
    for layer in model.layers:
        x = layer.run(x, lambda h, a=layer.attn: a.prefill_packed(h, inp.positions, inp.slots, mask, cache, one_prompt,
                                                                    bank=(inp.bank_index, inp.bases)))
    return model.head(x[inp.last_index])  # [R, V]
