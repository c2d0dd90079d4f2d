"""Checkpoint tensors: the names and shapes a DeepSeek-V2 checkpoint must hold, and a loader that
memory-maps the safetensors shards through the index and reads only what one rank owns."""
from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open

from pegainfer.engine.config import ModelConfig

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class WeightsError(ValueError):
    """A checkpoint's tensors do not match what its config describes."""


def missing_files(model_dir: Path) -> list[str]:
    """What a checkpoint folder needs and `model_dir` lacks: config.json, tokenizer.json, and the
    weights (the shard index or one safetensors file); empty for a folder that looks like one."""
    missing = [name for name in ("config.json", "tokenizer.json") if not (model_dir / name).is_file()]
    if not (model_dir / INDEX_FILE).is_file() and not (model_dir / SINGLE_FILE).is_file():
        missing.append(f"{INDEX_FILE} or {SINGLE_FILE}")
    return missing


def expert_tensor(layer: int, expert: int, proj: str) -> str:
    return f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight"


def expected_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name a checkpoint of this config holds, with its shape (HF layout: [out, in])."""
    h, nh = cfg.hidden_size, cfg.num_attention_heads
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        out[f"{p}.input_layernorm.weight"] = (h,)
        out[f"{p}.post_attention_layernorm.weight"] = (h,)
        a = f"{p}.self_attn"
        if cfg.q_lora_rank is None:
            out[f"{a}.q_proj.weight"] = (nh * cfg.qk_head_dim, h)
        else:
            out[f"{a}.q_a_proj.weight"] = (cfg.q_lora_rank, h)
            out[f"{a}.q_a_layernorm.weight"] = (cfg.q_lora_rank,)
            out[f"{a}.q_b_proj.weight"] = (nh * cfg.qk_head_dim, cfg.q_lora_rank)
        out[f"{a}.kv_a_proj_with_mqa.weight"] = (cfg.cache_width, h)
        out[f"{a}.kv_a_layernorm.weight"] = (cfg.kv_lora_rank,)
        out[f"{a}.kv_b_proj.weight"] = (nh * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank)
        out[f"{a}.o_proj.weight"] = (h, nh * cfg.v_head_dim)
        m = f"{p}.mlp"
        if cfg.is_moe_layer(i):
            inter = cfg.moe_intermediate_size
            out[f"{m}.gate.weight"] = (cfg.n_routed_experts, h)
            for e in range(cfg.n_routed_experts):
                out[expert_tensor(i, e, "gate_proj")] = (inter, h)
                out[expert_tensor(i, e, "up_proj")] = (inter, h)
                out[expert_tensor(i, e, "down_proj")] = (h, inter)
            shared = inter * cfg.n_shared_experts
            out[f"{m}.shared_experts.gate_proj.weight"] = (shared, h)
            out[f"{m}.shared_experts.up_proj.weight"] = (shared, h)
            out[f"{m}.shared_experts.down_proj.weight"] = (h, shared)
        else:
            out[f"{m}.gate_proj.weight"] = (cfg.intermediate_size, h)
            out[f"{m}.up_proj.weight"] = (cfg.intermediate_size, h)
            out[f"{m}.down_proj.weight"] = (h, cfg.intermediate_size)
    return out


def is_expert_tensor(name: str) -> int | None:
    """The routed-expert index a tensor name belongs to, or None for a non-expert tensor."""
    parts = name.split(".")
    if len(parts) > 5 and parts[3] == "mlp" and parts[4] == "experts":
        return int(parts[5])
    return None


@dataclasses.dataclass(slots=True)
class LoadStats:
    shards: int = 0
    shards_opened: int = 0
    open_s: float = 0.0
    read_s: float = 0.0
    bytes: int = 0
    tensors: int = 0
    total_s: float = 0.0


def shard_map(model_dir: Path) -> dict[str, str]:
    """Tensor name -> shard file name, from the index (or the single-file checkpoint)."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            return dict(json.loads(index.read_text())["weight_map"])
        except (json.JSONDecodeError, KeyError) as e:
            raise WeightsError(f"{index}: unreadable index ({e})") from None
    single = model_dir / SINGLE_FILE
    if single.is_file():
        with safe_open(str(single), framework="pt") as f:
            return {k: SINGLE_FILE for k in f.keys()}
    raise WeightsError(f"{model_dir}: no {INDEX_FILE} or {SINGLE_FILE}")


def load_tensors(
    model_dir: str | Path,
    cfg: ModelConfig,
    *,
    keep: Callable[[str], bool] = lambda name: True,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> tuple[dict[str, torch.Tensor], LoadStats]:
    """Check the checkpoint against the config, then read the tensors `keep` selects.

    Every expected tensor must be present with its shape; names the config does not expect are an
    error (they mean the config and the weights disagree). Only kept tensors are deserialised."""
    t0 = time.perf_counter()
    model_dir = Path(model_dir)
    expected = expected_tensors(cfg)
    where = shard_map(model_dir)
    missing = [n for n in expected if n not in where]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WeightsError(f"{model_dir}: tensor {missing[0]} is missing from the checkpoint{more}")
    unexpected = sorted(n for n in where if n not in expected)
    if unexpected:
        raise WeightsError(f"{model_dir}/{where[unexpected[0]]}: unexpected tensor {unexpected[0]} "
                           f"(not described by config.json; {len(unexpected)} in all)")
    stats = LoadStats(shards=len(set(where.values())))
    by_shard: dict[str, list[str]] = {}
    for name, shard in where.items():
        by_shard.setdefault(shard, []).append(name)
    ckpt_dtype = _torch_dtype(cfg.torch_dtype)
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(by_shard):
        path = model_dir / shard
        if not path.is_file():
            raise WeightsError(f"{path}: shard file is missing (the index names it for {by_shard[shard][0]})")
        t = time.perf_counter()
        with safe_open(str(path), framework="pt") as f:
            stats.open_s += time.perf_counter() - t
            stats.shards_opened += 1
            present = set(f.keys())
            for name in by_shard[shard]:
                if name not in present:
                    raise WeightsError(f"{path}: tensor {name} is missing from this shard (the index names it)")
                sl = f.get_slice(name)
                shape, want = tuple(sl.get_shape()), expected[name]
                if shape != want:
                    raise WeightsError(f"{path}: tensor {name} has shape {list(shape)}, expected {list(want)}")
                got_dtype = _SAFETENSORS_DTYPES.get(sl.get_dtype())
                if got_dtype != ckpt_dtype:
                    raise WeightsError(f"{path}: tensor {name} has dtype {sl.get_dtype()}, "
                                       f"expected {cfg.torch_dtype} (config.json torch_dtype)")
                if not keep(name):
                    continue
                t = time.perf_counter()
                tensor = f.get_tensor(name)
                tensor = tensor.to(device=device, dtype=dtype or tensor.dtype)
                stats.read_s += time.perf_counter() - t
                stats.bytes += tensor.numel() * tensor.element_size()
                stats.tensors += 1
                out[name] = tensor
    stats.total_s = time.perf_counter() - t0
    return out, stats


_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def _torch_dtype(name: str) -> torch.dtype:
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in table:
        raise WeightsError(f"config.json torch_dtype {name!r} is not supported (float32, bfloat16, float16)")
    return table[name]
