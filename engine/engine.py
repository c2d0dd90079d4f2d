"""Rank 0's engine: config, weights, the model, the KV cache, the runner and the EP backend, built
from a checkpoint folder (or a random-weight preset). A request's limits are checked where it is
parsed; engine.admission asserts the invariants the engine relies on. The kernel configuration
(EngineSpec.kernels) is resolved against the device here, once, and handed to the backend, the model
and the graphs."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch

from pegainfer.engine.config import ModelConfig
from pegainfer.engine.cuda_graphs import DecodeGraphs
from pegainfer.engine.ep_setup import ep_spec, moe_shape
from pegainfer.engine.kernels import triton_available
from pegainfer.engine.kernels.config import KernelConfig
from pegainfer.engine.prefill_graphs import PrefillGraphs
from pegainfer.engine.kv_cache import PAGE_SIZE, MLACache
from pegainfer.engine.kv_capacity import kv_tokens, max_sequences
from pegainfer.engine.model.model import DeepseekV2
from pegainfer.engine.runner import ModelRunner
from pegainfer.engine.startup_log import log_event
from pegainfer.engine.step_counters import StepCounters
from pegainfer.engine.weights import LoadStats, is_expert_tensor, load_tensors
from pegainfer.ep.backend import ExpertBackend
from pegainfer.ep.experts import ExpertShard
from pegainfer.ep.ownership import Ownership
from pegainfer.ep.preflight import preflight

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class RequestError(ValueError):
    """A request that breaks an invariant the engine relies on (ids outside the vocabulary, over the
    context): the parse that built it should have refused it (engine.admission). It fails alone."""


@dataclasses.dataclass(frozen=True, slots=True)
class EngineSpec:
    model_dir: str | None = None  # HF checkpoint folder; None with random_preset
    random_preset: str | None = None  # initialise a preset's shapes with random weights on device
    seed: int = 0
    device: str = "cpu"
    dtype: str | None = None  # default: float32 on CPU, bfloat16 on CUDA
    backend: str = "local"
    ep_size: int = 1
    max_model_len: int | None = None  # default: min(max_position_embeddings, 4096)
    num_slots: int | None = 8  # sequences holding KV pages at once (--max-active); None: the default (CUDA: 1024)
    kv_cache_tokens: int | None = None  # KV cache size in tokens; None: from free memory (CUDA), max(8, slots) x max_len (CPU)
    prefix_caching: bool = True  # share cached full pages of a prompt's prefix (--no-prefix-caching)
    rank_timeout_s: float = 10.0  # a silent expert rank fails the engine after this long
    rank_join_timeout_s: float | None = None  # how long rank 0 waits for ranks to load (default 300 s)
    ep_master_addr: str | None = None  # set: wait for `pegainfer expert-worker` ranks instead of spawning
    ep_master_port: int | None = None
    ep_chunk_bytes: int | None = None  # nccl backend: largest single collective (default 64 MiB)
    cuda_graphs: bool = True  # capture the decode step on CUDA when the EP backend is graph-safe
    # how the decode graph chooses sampled rows' tokens (engine/cuda_graphs.py SAMPLERS): "auto", the
    # device sampler inside the graph (issue 33); "off", logits out to engine.sampler (the A/B's other side)
    device_sampler: str = "auto"
    # every kernel choice (engine/kernels/config.py); its `triton`: the Triton decode step, prompt
    # attention and expert kernels on CUDA (bf16). The prompt path's MoE combine uses its Triton
    # kernel wherever Triton imports, for every backend alike (ep/plan.py)
    kernels: KernelConfig = KernelConfig()
    max_prefill_tokens: int = 8192  # the largest prefill step (the GPU thread's per-step prompt budget)

    def torch_dtype(self) -> torch.dtype:
        name = self.dtype or ("bfloat16" if self.device.startswith("cuda") else "float32")
        if name not in DTYPES:
            raise ValueError(f"unsupported dtype {name!r} (float32 or bfloat16)")
        return DTYPES[name]


class Engine:
    def __init__(self, spec: EngineSpec, cfg: ModelConfig, model: DeepseekV2, cache: MLACache,
                 backend: ExpertBackend, graphs: DecodeGraphs | None = None,
                 prefill_graphs: PrefillGraphs | None = None):
        self.spec = spec
        self.cfg = cfg
        self.model = model
        self.cache = cache
        self.backend = backend
        self.runner = ModelRunner(model, cache, spec.device, graphs, prefill_graphs)
        self.counters = StepCounters(model.routes, Ownership(cfg.n_routed_experts, spec.ep_size), backend)
        self.eos_id = cfg.eos_token_id
        self.max_model_len = cache.max_len

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @property
    def maturity(self) -> str:
        return self.backend.maturity

    @property
    def batch_invariant(self) -> bool:
        """Whether a request's output is independent of the batch around it (KernelConfig.batch_invariant)."""
        return self.model.kernels.batch_invariant

    def close(self) -> None:
        self.backend.close()


def build_engine(spec: EngineSpec) -> Engine:
    t0 = time.perf_counter()
    device, dtype = torch.device(spec.device), spec.torch_dtype()
    entry = preflight(spec.backend, spec.device, spec.ep_size, remote_ranks=spec.ep_master_addr is not None,
                      allow_test_only=True)  # before loading anything: nccl without a GPU per rank fails here
    if spec.model_dir is not None:
        cfg = ModelConfig.load(spec.model_dir)
    else:
        from pegainfer.engine.presets import PRESETS
        cfg = ModelConfig.from_dict(PRESETS[spec.random_preset], f"preset {spec.random_preset}")
    ownership = Ownership(cfg.n_routed_experts, spec.ep_size)
    mine = ownership.experts_of(0)

    def keep(name: str) -> bool:
        e = is_expert_tensor(name)
        return e is None or e in mine

    if spec.model_dir is not None:
        tensors, stats = load_tensors(spec.model_dir, cfg, keep=keep, device=device, dtype=dtype)
    else:
        tensors, stats = _random_tensors(cfg, spec, keep, device, dtype)
    log_event("weights_loaded", rank=0, shards=stats.shards, open_s=round(stats.open_s, 4),
              read_s=round(stats.read_s, 4), bytes=stats.bytes, tensors=stats.tensors,
              load_s=round(stats.total_s, 4), device=str(device), dtype=str(dtype).removeprefix("torch."),
              backend=entry.name, maturity=entry.maturity, experts=f"{mine.start}..{mine.stop - 1}")
    shard = ExpertShard.from_tensors(mine, tensors, cfg.moe_layers)
    backend = entry.load().start(ep_spec(spec), moe_shape(cfg), ownership, shard)
    log_event("expert_kernel", backend=entry.name, kernel=backend.caps.expert_kernel, graph_safe=backend.caps.graph_safe)
    max_len = spec.max_model_len or min(cfg.max_position_embeddings, 4096)
    if max_len > cfg.max_position_embeddings:
        raise ValueError(f"max_model_len {max_len} exceeds the model's max_position_embeddings "
                         f"{cfg.max_position_embeddings}")
    kernels = spec.kernels.on_device(device.type == "cuda", dtype == torch.bfloat16, triton_available())
    model = DeepseekV2(cfg, tensors, backend, max_len, device, kernels)
    slots = max_sequences(device, spec.num_slots)
    partials = split_partials(kernels, cfg, slots, max_len)
    tokens, free = kv_tokens(device, max_len, MLACache.bytes_per_token(cfg.num_hidden_layers, cfg.cache_width, dtype),
                             PAGE_SIZE, spec.kv_cache_tokens, slots, partials)
    log_event("kv_capacity", slots=slots, tokens=tokens, page_size=PAGE_SIZE, max_model_len=max_len, free_bytes=free,
              cap=spec.num_slots, prefix_caching=spec.prefix_caching, attention_partials_bytes=partials)
    cache = MLACache(cfg.num_hidden_layers, slots, max_len, cfg.cache_width, device, dtype,
                     num_pages=tokens // PAGE_SIZE, prefix_caching=spec.prefix_caching)
    graphs = prefill_graphs = None
    if device.type == "cuda" and spec.cuda_graphs and backend.caps.graph_safe:
        graphs = DecodeGraphs(model, cache, slots, cache.scratch_slot, sampler=spec.device_sampler)
        prefill_graphs = PrefillGraphs(model, cache, graphs.pool, max_tokens=spec.max_prefill_tokens)
    log_event("decode_path", cuda_graphs=graphs is not None, triton_kernels=kernels.triton,
              batch_invariant=kernels.batch_invariant,
              attention=("mla_absorbed_triton" if model.layers[0].attn.fused_decode else "mla_absorbed")
              if graphs else "mla_expand",
              experts=backend.caps.expert_kernel, shared_experts_stream=model.side_stream is not None,
              **(one_launch_sizes(kernels, backend.caps.fused_alignment) if kernels.triton else {}))
    log_event("engine_ready", backend=entry.name, maturity=entry.maturity, batch_invariant=kernels.batch_invariant,
              ep_size=spec.ep_size,
              max_model_len=max_len, kv_slots=slots, kv_tokens=tokens,
              kv_bytes=cache.data.numel() * cache.data.element_size(),
              startup_s=round(time.perf_counter() - t0, 4))
    return Engine(spec, cfg, model, cache, backend, graphs, prefill_graphs)


def one_launch_sizes(kernels: KernelConfig, fused_router: bool) -> dict:
    """Up to how many rows the decode step's one-launch kernels run (engine/kernels: the layer input
    in the q/kv_a launch, the first layer's reading the embedding row itself; attention's output
    with the add and norm, the router where the backend's experts read its listing (fused_router:
    BackendCaps.fused_alignment), the shared experts' and dense layers' gate-up with SwiGLU, the LM
    head with the argmax, the argmax)."""
    from pegainfer.engine.kernels.moe_route import SMALL
    return dict(norm_proj_rows=kernels.norm_proj_rows,
                embedding_in_norm_proj=bool(kernels.embed_in_norm and kernels.norm_proj_rows),
                # batch-invariant mode's layer input and MLA output launches (engine/kernels/norm_linear.py)
                norm_linear_rows=kernels.norm_linear_rows if kernels.batch_invariant else 0,
                mla_output_rows=kernels.mla_output_rows,
                router_one_launch_rows=SMALL if kernels.router_one_launch and fused_router else 0,
                dense_swiglu_rows=kernels.dense_rows, head_argmax_rows=kernels.head_argmax_rows,
                argmax_rows=kernels.argmax_rows)


def _random_tensors(cfg: ModelConfig, spec: EngineSpec, keep, device, dtype) -> tuple[dict, LoadStats]:
    from pegainfer.engine.presets import random_tensors
    t0 = time.perf_counter()
    stats = LoadStats()
    out = {}
    for name, t in random_tensors(cfg, spec.seed, device=device, dtype=dtype, keep=keep):
        out[name] = t
        stats.bytes += t.numel() * t.element_size()
        stats.tensors += 1
    stats.total_s = stats.read_s = time.perf_counter() - t0
    return out, stats


def default_model_dir() -> Path:
    """The model served without --model: the embedded trained checkpoint."""
    from pegainfer.engine.default_model import trained_model_dir
    return trained_model_dir()


def split_partials(kernels: KernelConfig, cfg: ModelConfig, rows: int, max_len: int) -> int:
    """Bytes the batch-invariant split attention's partials take at the largest decode graph (rows x
    the most splits a row of max_len has; engine/kernels/mla_rule.py), kept out of the KV cache; 0
    where that plan does not run (the CPU, no Triton, --no-batch-invariant)."""
    if not (kernels.triton and kernels.batch_invariant):
        return 0
    from pegainfer.engine.kernels.mla_rule import partial_bytes, rule_of
    return partial_bytes(rows, max_len, cfg.num_attention_heads, cfg.kv_lora_rank, rule_of(kernels),
                         kernels.decode_merge_group)
