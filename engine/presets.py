"""Synthetic model presets: the config.json of the published DeepSeek-V2-Lite ("lite") and of a
tiny CPU-sized model of the same family ("tiny"), and the deterministic random weights that stand
in for trained ones when there is no checkpoint to download."""
from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Iterator

import torch

from pegainfer.engine.config import ModelConfig
from pegainfer.engine.weights import expected_tensors

# deepseek-ai/DeepSeek-V2-Lite config.json, field for field, less auto_map (we run no remote code).
_LITE: dict = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001,
    "bos_token_id": 100000,
    "eos_token_id": 100001,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 10944,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408,
    "moe_layer_freq": 1,
    "n_group": 1,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "norm_topk_prob": False,
    "num_attention_heads": 16,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 27,
    "num_key_value_heads": 16,
    "pretraining_tp": 1,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 1.0,
    "scoring_func": "softmax",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "greedy",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 102400,
}

# Same field set and the same YaRN scaling, shapes small enough for CPU tests. Layer 0 is dense and
# layers 1..3 are MoE, as in Lite. BOS/EOS sit right after the 1000 trained BPE tokens (see
# engine/checkpoint_writer.py), the way DeepSeek's sit right after its 100000.
_TINY: dict = {
    **copy.deepcopy(_LITE),
    "bos_token_id": 1000,
    "eos_token_id": 1001,
    "hidden_size": 64,
    "intermediate_size": 128,
    "kv_lora_rank": 32,
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
    "n_shared_experts": 2,
    "num_attention_heads": 4,
    "num_experts_per_tok": 3,
    "num_hidden_layers": 4,
    "num_key_value_heads": 4,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "torch_dtype": "float32",
    "v_head_dim": 16,
    "vocab_size": 1024,
}

PRESETS: dict[str, dict] = {"lite": _LITE, "tiny": _TINY}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def preset_config(name: str) -> dict:
    """A fresh copy of a preset's config.json dict (callers may mutate it)."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r} (expected one of {sorted(PRESETS)})")
    return copy.deepcopy(PRESETS[name])


def tensor_seed(seed: int, name: str) -> int:
    """One generator seed per (seed, tensor): any subset of tensors (one rank's experts) can be made
    alone, in any order, and still equal the same tensors of a full checkpoint."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def random_tensor(name: str, shape: tuple[int, ...], seed: int, device: torch.device | str = "cpu",
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """One tensor of a random checkpoint, drawn on `device` with that device's generator.

    Scales keep activations near unit RMS through every layer, so the logits are spread wide
    enough that greedy decoding is decided by the weights, not by rounding noise."""
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(tensor_seed(seed, name))
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    if name.endswith("embed_tokens.weight"):
        pass  # N(0, 1): the first residual stream has unit RMS
    elif len(shape) == 1:  # RMSNorm gains: near 1, but not exactly, so a dropped norm shows up
        x.mul_(0.1).add_(1.0)
    else:  # [out, in] projections: std 1/sqrt(fan_in) keeps output RMS ~ input RMS
        x.mul_(shape[-1] ** -0.5)
    return x.to(dtype)


def random_tensors(
    cfg: ModelConfig,
    seed: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    *,
    keep: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor the config expects, in expected_tensors order, one at a time
    (a caller that streams them never holds two copies of the model). Deterministic per seed and
    device type; dtype defaults to the config's torch_dtype. `keep` selects a subset by name."""
    if dtype is None and cfg.torch_dtype not in DTYPES:
        raise ValueError(f"torch_dtype {cfg.torch_dtype!r} is not supported (expected one of {sorted(DTYPES)})")
    out_dtype = dtype or DTYPES[cfg.torch_dtype]
    for name, shape in expected_tensors(cfg).items():
        if keep is None or keep(name):
            yield name, random_tensor(name, shape, seed, device, out_dtype)
