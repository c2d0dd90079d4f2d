"""The Hugging Face side of the direct benchmark: transformers' DeepseekV2ForCausalLM holding the
same weights as the engine, and its greedy generate() timed per step.

For a checkpoint folder HF loads it itself (tools/hf_oracle.load_hf, which refuses any weight HF
would re-initialise). For a random preset HF is built from the preset's config on the device and
every tensor of the preset's random checkpoint is copied in, per-expert tensors into HF's fused
`experts.gate_up_proj` [E, 2I, H] (gate rows, then up rows) and `experts.down_proj` [E, H, I]."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import torch

from pegainfer.engine.config import ModelConfig
from pegainfer.engine.presets import preset_config, random_tensors
from tools.benchkit.direct import Timing


class HFSideError(RuntimeError):
    """HF does not hold exactly our weights (a tensor without a home, or a parameter left unwritten)."""


def from_dir(model_dir: str, dtype: torch.dtype, device: str):
    from tools.hf_oracle import load_hf
    return load_hf(Path(model_dir), dtype, device), f"from_pretrained({model_dir}) with the oracle's weight check"


def _target(params: dict[str, torch.Tensor], name: str) -> tuple[str, torch.Tensor]:
    """HF parameter name and the view of it that our tensor `name` fills."""
    parts = name.split(".")
    if len(parts) > 5 and parts[4] == "experts":  # model.layers.L.mlp.experts.E.<proj>.weight
        prefix, e, proj = ".".join(parts[:5]), int(parts[5]), parts[6]
        if proj == "down_proj":
            return f"{prefix}.down_proj", params[f"{prefix}.down_proj"][e]  # [H, I]
        fused = params[f"{prefix}.gate_up_proj"][e]  # [2I, H]
        half = fused.shape[0] // 2
        return f"{prefix}.gate_up_proj", fused[:half] if proj == "gate_proj" else fused[half:]
    if name not in params:
        raise HFSideError(f"HF has no parameter for our tensor {name}")
    return name, params[name]


def from_preset(preset: str, seed: int, dtype: torch.dtype, device: str, weights_dtype: torch.dtype | None = None):
    """HF model of a preset's shapes with the engine's random weights (same seed, device, dtype).
    weights_dtype: draw the weights in it and widen them into `dtype` (a float32 model of a bf16
    checkpoint: the same numbers, computed in float32)."""
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM
    raw = preset_config(preset)
    cfg = ModelConfig.from_dict(raw, f"preset {preset}")
    config = DeepseekV2Config.from_dict(raw)
    with torch.device(device):
        model = DeepseekV2ForCausalLM._from_config(config, dtype=dtype)
    params = dict(model.named_parameters())
    written = dict.fromkeys(params, 0)
    with torch.no_grad():
        for name, tensor in random_tensors(cfg, seed, device=device, dtype=weights_dtype or dtype):
            target, view = _target(params, name)
            if tuple(view.shape) != tuple(tensor.shape):
                raise HFSideError(f"{name}: ours {list(tensor.shape)}, HF's {target} slice {list(view.shape)}")
            view.copy_(tensor)
            written[target] += tensor.numel()
    unwritten = [n for n, p in params.items() if written[n] != p.numel()]
    if unwritten:
        raise HFSideError(f"HF parameters not (fully) written from our weights: {unwritten[:3]}")
    return model.eval(), f"DeepseekV2ForCausalLM(config of preset {preset}) with our random tensors copied in"


def describe(model) -> dict:
    c = model.config
    return {"attn_implementation": getattr(c, "_attn_implementation", None),
            "experts_implementation": getattr(c, "_experts_implementation", None),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch.")}


@contextlib.contextmanager
def routing_patch(model, norm_topk_prob: bool):
    """transformers ignores norm_topk_prob; the oracle's patch makes HF do what the model card says."""
    from tools.hf_oracle import hf_norm_topk_patch
    with hf_norm_topk_patch(model, norm_topk_prob) as patches:
        yield patches


def generate_timed(model, prompts: list[list[int]], new_tokens: int, device: str,
                   sync: Callable[[], None]) -> Timing:
    """HF greedy generate() of exactly new_tokens tokens for the rows' prompts (all one length), with a
    logits processor stamping the time (after a synchronize) as each step's logits arrive."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class StepClock(LogitsProcessor):
        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids, scores):
            sync()
            self.times.append(time.perf_counter())
            return scores

    clock = StepClock()
    ids = torch.tensor(prompts, device=device)  # [B, P]
    sync()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=0,
                             do_sample=False, use_cache=True, eos_token_id=None, pad_token_id=0,
                             logits_processor=LogitsProcessorList([clock]))  # [B, P + new_tokens]
    stamps = [t0, *clock.times]
    steps = [b - a for a, b in zip(stamps[1:], stamps[2:])]
    return Timing(stamps[1] - t0, steps, out[:, len(prompts[0]):].tolist())
