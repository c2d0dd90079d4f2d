"""The MoE gate, the reference form: softmax scores over routed experts and the top-k routes per
token, with the DeepSeek-V2 selection methods (greedy, group-limited greedy). Model math, used by the
MoE layer (engine/model/moe.py); its kernel form is engine/kernels/moe_route.py fused_route."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def route(hidden: torch.Tensor, gate_weight: torch.Tensor, *, top_k: int, method: str = "greedy",
          n_group: int | None = None, topk_group: int | None = None, norm_topk_prob: bool = False,
          scaling: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden: [T, H]; gate_weight: [E, H]. Returns (weights [T, k] float32, experts [T, k] int64).

    Scores are computed in float32 whatever the model dtype, as the reference does."""
    logits = F.linear(hidden.float(), gate_weight.float())  # [T, E]
    scores = logits.softmax(dim=-1, dtype=torch.float32)
    if method == "group_limited_greedy":
        t, e = scores.shape
        group_scores = scores.view(t, n_group, e // n_group).max(dim=-1).values  # [T, G]
        group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]  # [T, g]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(t, n_group, e // n_group).reshape(t, e)
        scores = scores.masked_fill(~score_mask.bool(), 0.0)
    weights, experts = torch.topk(scores, k=top_k, dim=-1, sorted=False)  # [T, k]
    if norm_topk_prob and top_k > 1:
        # DeepSeek-V2's published semantics (vLLM and SGLang follow them); transformers ignores the flag.
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scaling, experts
