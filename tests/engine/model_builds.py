"""A second model over an engine's own weights, built with another KernelConfig and expert kernel: the
model-level tests compare the forms the configuration selects (the decode step with and without the
Triton kernels, in Triton's interpreter on the CPU) on one set of weights."""
from __future__ import annotations

import torch

from pegainfer.engine.engine import Engine
from pegainfer.engine.kernels.config import KernelConfig
from pegainfer.engine.model.model import DeepseekV2
from pegainfer.engine.presets import random_tensors
from pegainfer.engine.weights import load_tensors
from pegainfer.ep.backends.local import LocalBackend
from pegainfer.ep.experts import ExpertKernel, ExpertShard


def rebuild(engine: Engine, kernels: KernelConfig, expert_kernel: str) -> DeepseekV2:
    """The engine's weights (its checkpoint, or its preset and seed) read again into a model with
    `kernels` (taken as resolved: its `triton` runs, on any device) and a local backend whose
    experts run `expert_kernel` ("triton": the router's listing, as on CUDA in bf16)."""
    spec, cfg = engine.spec, engine.cfg
    dtype, device = spec.torch_dtype(), torch.device(spec.device)
    if spec.model_dir is not None:
        tensors, _ = load_tensors(spec.model_dir, cfg, device=device, dtype=dtype)
    else:
        tensors = dict(random_tensors(cfg, spec.seed, device=device, dtype=dtype))
    shard = ExpertShard.from_tensors(range(cfg.n_routed_experts), tensors, cfg.moe_layers)
    backend = LocalBackend(shard, ExpertKernel(expert_kernel, kernels.experts))
    return DeepseekV2(cfg, tensors, backend, engine.cache.max_len, device, kernels)
