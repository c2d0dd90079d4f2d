"""The DeepSeek-V2 model on rank 0: embeddings, decoder layers (MLA attention over the latent cache,
then the dense MLP or the MoE layer: shared experts here, routed experts through an EP backend), the
final norm and the LM head. `forward`/`hidden` run the reference computation over any mix of rows
(Batch: prompt chunks over their earlier cache and one-token rows); the graph-capturable steps of
each phase are engine/model/decode.py and engine/model/prefill.py. The KernelConfig the model is
built with says which kernels every part runs; nothing changes it afterwards."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from pegainfer.engine.batch import Batch
from pegainfer.engine.config import ModelConfig
from pegainfer.engine.kernels.config import KernelConfig
from pegainfer.engine.kernels.linear import linear
from pegainfer.engine.kv_cache import MLACache
from pegainfer.engine.model.attention import MLAttention
from pegainfer.engine.model.mlp import MLP
from pegainfer.engine.model.norm import rms_norm
from pegainfer.engine.model.moe import MoE
from pegainfer.engine.model.route_counts import RouteCounts
from pegainfer.engine.model.rope import Rope
from pegainfer.engine.phases import phase
from pegainfer.ep.backend import ExpertBackend


class DecoderLayer:
    def __init__(self, cfg: ModelConfig, layer: int, w: dict[str, torch.Tensor], model: DeepseekV2):
        p = f"model.layers.{layer}"
        k = model.kernels
        self.kernels = k
        self.eps = cfg.rms_norm_eps
        self.input_norm = w.pop(f"{p}.input_layernorm.weight")
        self.post_attn_norm = w.pop(f"{p}.post_attention_layernorm.weight")
        self.attn = MLAttention(cfg, layer, w, model.rope, k)
        m = f"{p}.mlp"
        if cfg.is_moe_layer(layer):
            shared = MLP(w.pop(f"{m}.shared_experts.gate_proj.weight"), w.pop(f"{m}.shared_experts.up_proj.weight"),
                         w.pop(f"{m}.shared_experts.down_proj.weight"), k)
            self.mlp = MoE(layer, cfg, w.pop(f"{m}.gate.weight"), shared, model.backend, model.routes,
                           model.router_ticket)
        else:
            self.mlp = MLP(w.pop(f"{m}.gate_proj.weight"), w.pop(f"{m}.up_proj.weight"), w.pop(f"{m}.down_proj.weight"), k)

    def run(self, x: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """x: [T, H] -> [T, H]: attention (whichever form `attend` computes, on the normed input),
        then the dense MLP or the MoE, each added to the residual stream."""
        with phase("attention"):
            x = x + attend(rms_norm(x, self.input_norm, self.eps, self.kernels))
        if isinstance(self.mlp, MoE):
            return x + self.mlp(rms_norm(x, self.post_attn_norm, self.eps, self.kernels))
        with phase("dense_mlp"):
            return x + self.mlp(rms_norm(x, self.post_attn_norm, self.eps, self.kernels))

    def mlp_decode(self, h: torch.Tensor, side: torch.cuda.Stream | None):
        """The decode step's MLP on the normed input h [B, H]: what the next norm adds (a tensor, or a
        MoE layer's parts with the Triton kernels: MoE.decode)."""
        if isinstance(self.mlp, MoE):
            return self.mlp.decode(h, side)
        with phase("dense_mlp"):
            return self.mlp.decode(h)

    def __call__(self, x: torch.Tensor, batch: Batch, cache: MLACache) -> torch.Tensor:
        return self.run(x, lambda h: self.attn(h, batch, cache))


class DeepseekV2:
    """Rank 0's model. Routed experts are reached only through `backend`."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], backend: ExpertBackend,
                 max_len: int, device: torch.device | str, kernels: KernelConfig):
        """kernels: what runs where; its `triton` must already say whether the Triton kernels can run
        on `device` (KernelConfig.on_device)."""
        self.cfg = cfg
        self.backend = backend
        self.kernels = kernels
        self.rope = Rope(cfg, max_len, device)
        self.embed = weights.pop("model.embed_tokens.weight")  # [V, H]
        dev = self.embed.device
        self.routes = RouteCounts(cfg.n_routed_experts, dev)  # every MoE layer's routes, per expert
        self.router_ticket = torch.zeros(1, dtype=torch.int32, device=dev)  # the one-launch router's (zero at rest)
        self.layers = [DecoderLayer(cfg, i, weights, self) for i in range(cfg.num_hidden_layers)]
        self.norm = weights.pop("model.norm.weight")
        self.lm_head = self.embed if cfg.tie_word_embeddings else weights.pop("lm_head.weight")  # [V, H]
        self.side_stream: torch.cuda.Stream | None = None  # the shared experts' stream in the Triton decode step
        self.argmax_ticket: torch.Tensor | None = None  # the decode step's greedy choice (kernels/argmax.py)
        if kernels.triton:
            from pegainfer.engine.kernels import ticket
            if self.embed.is_cuda:
                self.side_stream = torch.cuda.Stream(device=dev)
            # the argmax's tickets, one per row it takes; the head + argmax launch uses the first
            self.argmax_ticket = ticket.tickets(max(kernels.argmax_rows, 1), dev)
        if weights:
            raise ValueError(f"unused tensors after building the model: {sorted(weights)[:3]}")

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
            return self.logits(rms_norm(x, self.norm, self.cfg.rms_norm_eps, self.kernels))

    @property
    def logits_dtype(self) -> torch.dtype:
        """The dtype of the LM head's logits (KernelConfig.float32_logits)."""
        return torch.float32 if self.kernels.float32_logits else self.lm_head.dtype

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The LM head alone: [R, H] after the final norm -> [R, V], float32 where
        KernelConfig.float32_logits (else the model dtype)."""
        return linear(h, self.lm_head, self.kernels, self.logits_dtype)
