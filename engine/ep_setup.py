"""What the engine hands ep/ at start-up, so that ep/ never reads the engine's spec, config or
weights: the EPSpec (plain EP settings) built from an EngineSpec, the MoEShape (the model facts the
transports size their buffers by) from a ModelConfig, and `load_rank_experts`, the ExpertLoader an
expert rank calls to load exactly the experts it owns (module-level, so that multiprocessing's
spawn pickles it by name into the ranks rank 0 starts; `pegainfer expert-worker` passes it too)."""
from __future__ import annotations

import torch

from pegainfer.engine.config import ModelConfig
from pegainfer.engine.weights import is_expert_tensor, load_tensors
from pegainfer.ep.experts import ExpertShard
from pegainfer.ep.ownership import Ownership
from pegainfer.ep.spec import EPSpec, MoEShape, WeightSource, resolve_dtype


def model_config(source: WeightSource) -> ModelConfig:
    """The checkpoint's config.json, or the random preset's."""
    if source.model_dir is not None:
        return ModelConfig.load(source.model_dir)
    if source.random_preset is None:
        raise ValueError("an expert rank needs a model directory or a random preset")
    from pegainfer.engine.presets import PRESETS
    return ModelConfig.from_dict(PRESETS[source.random_preset], f"preset {source.random_preset}")


def moe_shape(cfg: ModelConfig) -> MoEShape:
    return MoEShape(cfg.n_routed_experts, tuple(cfg.moe_layers), cfg.hidden_size, cfg.moe_intermediate_size)


def ep_spec(spec) -> EPSpec:
    """spec: engine.engine.EngineSpec (duck-typed: this module is imported by engine.engine)."""
    return EPSpec(backend=spec.backend, ep_size=spec.ep_size, device=spec.device,
                  dtype=resolve_dtype(spec.dtype, spec.device), rank_timeout_s=spec.rank_timeout_s,
                  join_timeout_s=spec.rank_join_timeout_s, master_addr=spec.ep_master_addr,
                  master_port=spec.ep_master_port, chunk_bytes=spec.ep_chunk_bytes,
                  kernels=spec.kernels,
                  source=WeightSource(None if spec.model_dir is None else str(spec.model_dir), spec.random_preset,
                                      spec.seed),
                  loader=load_rank_experts)


def load_rank_experts(source: WeightSource, rank: int, world_size: int, device: torch.device,
                      dtype: torch.dtype) -> tuple[MoEShape, ExpertShard]:
    """Expert rank `rank`'s experts of every MoE layer, and nothing else: read from the checkpoint
    through the loader's keep filter, or drawn from the random preset with rank 0's seed (the same
    values rank 0 would draw)."""
    cfg = model_config(source)
    experts = Ownership(cfg.n_routed_experts, world_size).experts_of(rank)

    def keep(name: str) -> bool:
        e = is_expert_tensor(name)
        return e is not None and e in experts

    if source.model_dir is not None:
        tensors, _ = load_tensors(source.model_dir, cfg, keep=keep, device=device, dtype=dtype)
    else:
        from pegainfer.engine.presets import random_tensors
        tensors = dict(random_tensors(cfg, source.seed, device=device, dtype=dtype, keep=keep))
    shard = ExpertShard.from_tensors(experts, tensors, cfg.moe_layers)
    if tensors:
        raise ValueError(f"rank {rank} loaded tensors it does not use: {sorted(tensors)[:3]}")
    return moe_shape(cfg), shard
