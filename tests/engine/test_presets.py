from __future__ import annotations

import math

import pytest
import torch

from pegainfer.engine.config import ModelConfig
from pegainfer.engine.presets import PRESETS, preset_config, random_tensor, random_tensors, tensor_seed
from pegainfer.engine.weights import expected_tensors

# deepseek-ai/DeepSeek-V2-Lite config.json (less auto_map), as published.
PUBLISHED_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 16, "num_experts_per_tok": 6,
    "num_hidden_layers": 27, "num_key_value_heads": 16, "pretraining_tp": 1, "q_lora_rank": None,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128, "vocab_size": 102400,
}


def test_lite_is_the_published_config():
    assert PRESETS["lite"] == PUBLISHED_LITE
    cfg = ModelConfig.from_dict(PRESETS["lite"])
    assert cfg.moe_layers == list(range(1, 27))
    assert cfg.cache_width == 576
    params = sum(math.prod(s) for s in expected_tensors(cfg).values())
    assert 15.6e9 < params < 15.8e9  # "15.7B parameters"


def test_tiny_has_the_lite_field_set_with_small_shapes():
    tiny = PRESETS["tiny"]
    assert tiny.keys() == PRESETS["lite"].keys()
    assert tiny["rope_scaling"] == PRESETS["lite"]["rope_scaling"]
    cfg = ModelConfig.from_dict(tiny)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.n_routed_experts, cfg.vocab_size) == (64, 4, 8, 1024)
    assert cfg.moe_layers == [1, 2, 3]
    assert (cfg.bos_token_id, cfg.eos_token_id) == (1000, 1001)
    assert cfg.torch_dtype == "float32"


def test_preset_config_is_a_copy():
    raw = preset_config("tiny")
    raw["rope_scaling"]["factor"] = 1
    assert PRESETS["tiny"]["rope_scaling"]["factor"] == 40
    with pytest.raises(KeyError, match="unknown preset"):
        preset_config("huge")


def test_random_tensors_cover_every_expected_tensor_in_order():
    cfg = ModelConfig.from_dict(PRESETS["tiny"])
    got = [(name, tuple(t.shape), t.dtype) for name, t in random_tensors(cfg, seed=0)]
    assert got == [(name, shape, torch.float32) for name, shape in expected_tensors(cfg).items()]


def test_random_tensors_are_deterministic_per_seed():
    cfg = ModelConfig.from_dict(PRESETS["tiny"])
    a, b, c = (dict(random_tensors(cfg, seed=s)) for s in (0, 0, 1))
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not any(torch.equal(a[n], c[n]) for n in a)


def test_subset_equals_the_same_tensors_of_the_full_set():
    cfg = ModelConfig.from_dict(PRESETS["tiny"])
    full = dict(random_tensors(cfg, seed=7))
    owned = dict(random_tensors(cfg, seed=7, keep=lambda n: ".experts.3." in n))
    assert len(owned) == 3 * len(cfg.moe_layers)
    assert all(torch.equal(t, full[n]) for n, t in owned.items())
    assert tensor_seed(7, "a") != tensor_seed(7, "b") != tensor_seed(8, "b")


def test_lite_tensors_have_the_published_shapes_and_unit_scale_init():
    cfg = ModelConfig.from_dict(PRESETS["lite"])
    want = {"model.layers.5.mlp.experts.63.down_proj.weight", "model.layers.0.self_attn.kv_a_layernorm.weight"}
    got = dict(random_tensors(cfg, seed=0, keep=want.__contains__))
    down = got["model.layers.5.mlp.experts.63.down_proj.weight"]
    assert down.shape == (2048, 1408) and down.dtype == torch.bfloat16
    assert down.float().std().item() == pytest.approx(1408 ** -0.5, rel=0.02)  # std 1/sqrt(fan_in)
    norm = got["model.layers.0.self_attn.kv_a_layernorm.weight"].float()
    assert norm.shape == (512,)
    assert norm.mean().item() == pytest.approx(1.0, abs=0.02) and norm.std().item() == pytest.approx(0.1, rel=0.15)


def test_embeddings_are_unit_normal_and_dtype_can_be_overridden():
    t = random_tensor("model.embed_tokens.weight", (1024, 64), seed=0, dtype=torch.float16)
    assert t.dtype == torch.float16
    assert t.float().std().item() == pytest.approx(1.0, rel=0.03)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_random_tensors_on_cuda_are_deterministic():
    cfg = ModelConfig.from_dict(PRESETS["tiny"])
    a = dict(random_tensors(cfg, seed=0, device="cuda"))
    b = dict(random_tensors(cfg, seed=0, device="cuda"))
    assert all(t.is_cuda and torch.equal(t, b[n]) for n, t in a.items())
