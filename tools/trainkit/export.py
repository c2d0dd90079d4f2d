"""Writing a trained transformers DeepseekV2ForCausalLM as the checkpoint folder pegainfer (and HF)
load: safetensors shards with an index and per-expert tensor names (the published DeepSeek-V2-Lite
layout), config.json, generation_config.json, tokenizer.json and tokenizer_config.json (with the chat
template, as tools/make_tiny_model.py writes it). The folder appears whole or not at all."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from pegainfer.engine.checkpoint_writer import atomic_folder, shard_plan, tokenizer_config
from pegainfer.engine.config import ModelConfig
from pegainfer.engine.weights import INDEX_FILE, expected_tensors

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def per_expert_tensors(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF's fused expert tensors (gate_up_proj [E, 2I, H], down_proj [E, H, I]) split back into the
    checkpoint's per-expert names; every other tensor keeps its name. Checked against the names and
    shapes the loader expects, so a layout drift fails here, not at serve time."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        t = t.detach().to("cpu", torch.float32).contiguous()
        if name.endswith(".mlp.experts.gate_up_proj"):
            prefix, half = name[: -len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = t[e, :half].clone()
                out[f"{prefix}{e}.up_proj.weight"] = t[e, half:].clone()
        elif name.endswith(".mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = t[e].clone()
        else:
            out[name] = t
    want = expected_tensors(cfg)
    if set(out) != set(want):
        extra, missing = sorted(set(out) - set(want)), sorted(set(want) - set(out))
        raise RuntimeError(f"trained tensors do not match the checkpoint layout: extra {extra[:3]}, missing {missing[:3]}")
    bad = [n for n in want if tuple(out[n].shape) != want[n]]
    if bad:
        raise RuntimeError(f"{bad[0]}: shape {tuple(out[bad[0]].shape)}, the loader expects {want[bad[0]]}")
    return out


def write_trained_checkpoint(out_dir: Path, *, config: dict, state: dict[str, torch.Tensor], tokenizer_json: str,
                             extra_files: dict[str, str | bytes]) -> Path:
    """config: the config.json dict (torch_dtype names the stored dtype); extra_files: name -> contents
    (the training record, loss curve) written beside the checkpoint."""
    cfg = ModelConfig.from_dict(config, "trained config")
    tensors = per_expert_tensors(state, cfg)
    dtype = DTYPES[config["torch_dtype"]]

    def fill(folder: Path) -> None:
        (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
        _dump(folder / "tokenizer_config.json", tokenizer_config(chat_template=True))
        _dump(folder / "config.json", config)
        _dump(folder / "generation_config.json", {
            "_from_model_config": True, "bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
            "do_sample": True, "temperature": 0.3, "top_p": 0.95, "transformers_version": "4.33.1"})
        shards = shard_plan(cfg)
        weight_map, total = {}, 0
        for k, names in enumerate(shards, start=1):
            file = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
            part = {n: tensors[n].to(dtype) for n in sorted(names)}
            save_file(part, str(folder / file), metadata={"format": "pt"})
            total += sum(t.numel() * t.element_size() for t in part.values())
            weight_map.update(dict.fromkeys(part, file))
        _dump(folder / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
        for name, body in extra_files.items():
            (folder / name).write_bytes(body if isinstance(body, bytes) else body.encode("utf-8"))
        for path in folder.iterdir():
            path.chmod(0o644)  # safetensors writes owner-only files; a shipped checkpoint is readable

    return atomic_folder(out_dir, fill)


def _dump(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
