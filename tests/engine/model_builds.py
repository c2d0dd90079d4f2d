"""A second model over an engine's own weights, built with another KernelConfig and expert kernel: the
model-level tests compare the forms the configuration selects (the decode step with and without the
Triton kernels, in Triton's interpreter on the CPU) on one set of weights. Also what those tests
share to drive and watch a decode step: its inputs for a few probe rows, and the Triton launches
counted by kernel name."""
from __future__ import annotations

import collections

import torch

from pegainfer.engine.engine import Engine
from pegainfer.engine.kernels.config import KernelConfig
from pegainfer.engine.model.inputs import DecodeInputs
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


def decode_inputs(rows: list[int]) -> DecodeInputs:
    """A decode step's inputs for these of three probe rows (tokens 11, 12, 13 at positions 3, 7, 5 in
    slots 0, 1, 2), static bound 16."""
    t = torch.tensor
    pos = t([3, 7, 5])[rows]
    return DecodeInputs(t([11, 12, 13])[rows], pos, t([0, 1, 2])[rows], pos + 1, length=16)


def count_launches(monkeypatch, seen: collections.Counter):
    """Count every Triton launch the interpreter runs into `seen`, by kernel name; returns the
    interpreter's own run, to put back where a test stops counting before it ends."""
    from triton.runtime import interpreter
    run = interpreter.InterpretedFunction.run

    def counted(self, *args, **kwargs):
        seen[self.fn.__name__] += 1
        return run(self, *args, **kwargs)

    monkeypatch.setattr(interpreter.InterpretedFunction, "run", counted)
    return run
