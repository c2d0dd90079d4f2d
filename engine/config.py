"""The DeepSeek-V2-family model configuration: parsed from a checkpoint's config.json, validated,
with the derived quantities (YaRN frequencies, softmax scale) computed once."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A checkpoint's config.json cannot describe a model pegainfer runs."""


SUPPORTED_MODEL_TYPES = ("deepseek_v2",)
TOPK_METHODS = ("greedy", "group_limited_greedy")

# Fields that must be present in config.json (no defaults are invented for shapes).
_REQUIRED = (
    "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
    "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "first_k_dense_replace",
    "max_position_embeddings", "rms_norm_eps",
)


@dataclasses.dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    first_k_dense_replace: int
    max_position_embeddings: int
    rms_norm_eps: float
    q_lora_rank: int | None = None
    topk_method: str = "greedy"
    n_group: int | None = None
    topk_group: int | None = None
    norm_topk_prob: bool = False
    routed_scaling_factor: float = 1.0
    scoring_func: str = "softmax"
    moe_layer_freq: int = 1
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    torch_dtype: str = "bfloat16"

    # ---- derived -------------------------------------------------------------------------------
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cache_width(self) -> int:
        """Values cached per token per layer: the normalised latent plus the roped shared key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace and layer % self.moe_layer_freq == 0

    @property
    def moe_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_moe_layer(i)]

    def softmax_scale(self) -> float:
        scale = self.qk_head_dim ** -0.5
        rs = self.rope_scaling
        if rs and rs.get("mscale_all_dim"):
            m = yarn_mscale(float(rs["factor"]), float(rs["mscale_all_dim"]))
            scale = scale * m * m
        return scale

    # ---- parsing -------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> ModelConfig:
        mt = raw.get("model_type")
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(f"{source}: model_type {mt!r} is not supported (expected one of {SUPPORTED_MODEL_TYPES})")
        missing = [k for k in _REQUIRED if raw.get(k) is None]
        if missing:
            raise ConfigError(f"{source}: missing required field(s): {', '.join(missing)}")
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in raw.items() if k in names and v is not None}
        rs = raw.get("rope_scaling") or raw.get("rope_parameters")
        if rs is not None and rs.get("type", rs.get("rope_type")) in (None, "default"):
            rs = None
        kwargs["rope_scaling"] = dict(rs) if rs else None
        if isinstance(kwargs.get("eos_token_id"), list):
            kwargs["eos_token_id"] = kwargs["eos_token_id"][0]
        cfg = cls(**kwargs)
        cfg._validate(source)
        return cfg

    @classmethod
    def load(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ConfigError(f"{path}: not found (is {model_dir} a Hugging Face checkpoint folder?)")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: invalid JSON: {e}") from None
        return cls.from_dict(raw, str(path))

    def _validate(self, source: str) -> None:
        def bad(msg: str) -> ConfigError:
            return ConfigError(f"{source}: {msg}")

        if self.topk_method not in TOPK_METHODS:
            raise bad(f"topk_method {self.topk_method!r} is not supported (expected one of {TOPK_METHODS})")
        if self.scoring_func != "softmax":
            raise bad(f"scoring_func {self.scoring_func!r} is not supported (only 'softmax')")
        if self.hidden_act != "silu":
            raise bad(f"hidden_act {self.hidden_act!r} is not supported (only 'silu')")
        if self.num_experts_per_tok > self.n_routed_experts:
            raise bad("num_experts_per_tok exceeds n_routed_experts")
        if self.topk_method == "group_limited_greedy":
            if not self.n_group or not self.topk_group:
                raise bad("group_limited_greedy needs n_group and topk_group")
            if self.n_routed_experts % self.n_group:
                raise bad(f"n_routed_experts {self.n_routed_experts} is not divisible by n_group {self.n_group}")
        if self.qk_rope_head_dim % 2:
            raise bad("qk_rope_head_dim must be even")
        rs = self.rope_scaling
        if rs is not None:
            kind = rs.get("type", rs.get("rope_type"))
            if kind != "yarn":
                raise bad(f"rope_scaling type {kind!r} is not supported (yarn or none)")
            for k in ("factor", "original_max_position_embeddings"):
                if rs.get(k) is None:
                    raise bad(f"rope_scaling is missing {k!r}")


def yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
