"""The DeepSeek-V2 forward pass over a flattened batch: embeddings, MLA attention over the latent
cache, dense MLP or MoE (shared experts here, routed experts through an EP backend), LM head."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from engine.attention import MLAttention
from engine.batch import Batch
from engine.config import ModelConfig
from engine.kv_cache import MLACache
from engine.phases import phase
from engine.rope import Rope
from ep.backend import ExpertBackend
from ep.moe import MoE


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """As the reference: normalise in float32, cast back, then scale."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


class MLP:
    """SwiGLU MLP: the dense first layer(s) and the shared experts."""

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor):
        self.gate_up = torch.cat([gate, up])  # [2I, H]; gate and up below are views of it
        i = gate.shape[0]
        self.gate, self.up, self.down = self.gate_up[:i], self.gate_up[i:], down  # [I, H], [I, H], [H, I]
        self._dense_rows = None  # the one-launch SwiGLU's index tensors per row count (CUDA, few rows)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.silu(F.linear(x, self.gate)) * F.linear(x, self.up), self.down)

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        """The same with one projection for gate and up and one Triton launch for SiLU * up (CUDA);
        at a few rows gate, up and SiLU * up in one launch (engine/kernels/moe_experts.py dense_swiglu)."""
        from engine.kernels import moe_experts
        if x.shape[0] <= moe_experts.DENSE_MAX_ROWS:
            self._dense_rows = self._dense_rows or moe_experts.DenseRows()
            act = moe_experts.dense_swiglu(x, self.gate_up, self._dense_rows(x.shape[0], x.device))
        else:
            from engine.kernels.swiglu import swiglu
            act = swiglu(F.linear(x, self.gate_up))
        return F.linear(act, self.down)


class DecoderLayer:
    def __init__(self, cfg: ModelConfig, layer: int, w: dict[str, torch.Tensor], rope: Rope,
                 backend: ExpertBackend):
        p = f"model.layers.{layer}"
        self.eps = cfg.rms_norm_eps
        self.input_norm = w.pop(f"{p}.input_layernorm.weight")
        self.post_attn_norm = w.pop(f"{p}.post_attention_layernorm.weight")
        self.attn = MLAttention(cfg, layer, w, rope)
        m = f"{p}.mlp"
        if cfg.is_moe_layer(layer):
            shared = MLP(w.pop(f"{m}.shared_experts.gate_proj.weight"), w.pop(f"{m}.shared_experts.up_proj.weight"),
                         w.pop(f"{m}.shared_experts.down_proj.weight"))
            self.mlp = MoE(layer, cfg, w.pop(f"{m}.gate.weight"), shared, backend)
        else:
            self.mlp = MLP(w.pop(f"{m}.gate_proj.weight"), w.pop(f"{m}.up_proj.weight"), w.pop(f"{m}.down_proj.weight"))

    def run(self, x: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """x: [T, H] -> [T, H]: attention (whichever form `attend` computes, on the normed input),
        then the dense MLP or the MoE, each added to the residual stream."""
        with phase("attention"):
            x = x + attend(rms_norm(x, self.input_norm, self.eps))
        if isinstance(self.mlp, MoE):
            return x + self.mlp(rms_norm(x, self.post_attn_norm, self.eps))
        with phase("dense_mlp"):
            return x + self.mlp(rms_norm(x, self.post_attn_norm, self.eps))

    def __call__(self, x: torch.Tensor, batch: Batch, cache: MLACache) -> torch.Tensor:
        return self.run(x, lambda h: self.attn(h, batch, cache))


class DeepseekV2:
    """Rank 0's model. Routed experts are reached only through `backend`."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], backend: ExpertBackend,
                 max_len: int, device: torch.device | str):
        self.cfg = cfg
        self.backend = backend
        self.rope = Rope(cfg, max_len, device)
        self.embed = weights.pop("model.embed_tokens.weight")  # [V, H]
        self.layers = [DecoderLayer(cfg, i, weights, self.rope, backend) for i in range(cfg.num_hidden_layers)]
        self.norm = weights.pop("model.norm.weight")
        self.lm_head = self.embed if cfg.tie_word_embeddings else weights.pop("lm_head.weight")  # [V, H]
        self.fused_kernels = False  # Triton RMSNorm/MLA decode kernels in the decode step; see use_kernels
        self.side_stream: torch.cuda.Stream | None = None  # the shared experts' stream in the fused step
        self.argmax_ticket: torch.Tensor | None = None  # the fused step's greedy choice (kernels/argmax.py)
        if weights:
            raise ValueError(f"unused tensors after building the model: {sorted(weights)[:3]}")

    def use_kernels(self, on: bool) -> None:
        self.fused_kernels = on
        if on and self.embed.is_cuda and self.side_stream is None:
            self.side_stream = torch.cuda.Stream(device=self.embed.device)
        if on and self.argmax_ticket is None:
            from engine.kernels import argmax, ticket
            self.argmax_ticket = ticket.tickets(argmax.MAX_ROWS, self.embed.device)
        for layer in self.layers:
            layer.attn.use_kernels(decode=on, prefill=on)

    @torch.inference_mode()
    def forward(self, batch: Batch, cache: MLACache) -> torch.Tensor:
        """Returns logits [R, V] for the last new token of every row."""
        return self.head(self.hidden(batch, cache)[batch.last_index])

    @torch.inference_mode()
    def hidden(self, batch: Batch, cache: MLACache) -> torch.Tensor:
        """The last layer's output [T, H] for every new token (before the final norm and the LM head)."""
        x = F.embedding(batch.token_ids, self.embed)  # [T, H]
        for layer in self.layers:
            x = layer(x, batch, cache)
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head: [R, H] -> [R, V]."""
        with phase("lm_head"):
            return F.linear(rms_norm(x, self.norm, self.cfg.rms_norm_eps), self.lm_head)
