"""The MoE gate, the reference form: softmax scores over routed experts and the top-k routes per
token, with the DeepSeek-V2 selection methods (greedy, group-limited greedy). Model math, used by the
MoE layer (engine/model/moe.py); its kernel form is engine/kernels/moe_route.py fused_route.

Batch-invariant where KernelConfig.batch_invariant: a token's routes and weights are the same bits
whatever the other rows of the call. The logits go through the batch-invariant linear
(engine/kernels/linear.py); the softmax and the maxima are per-row ops; the selection is a stable
sort (the highest scores, the lowest expert first among equal ones, as the kernel's argmax picks),
where torch.topk's choice among equal scores belongs to its algorithm, which the row count selects
on CUDA; the renormalising sum adds a token's k weights left to right."""
from __future__ import annotations

import torch

from pegainfer.engine.kernels.config import KernelConfig
from pegainfer.engine.kernels.linear import linear


def _top(scores: torch.Tensor, k: int, invariant: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """scores [T, N] -> (values, indices) [T, k] of the k highest of each row."""
    if not invariant:
        return torch.topk(scores, k=k, dim=-1, sorted=False)
    values, indices = torch.sort(scores, dim=-1, descending=True, stable=True)  # [T, N]
    return values[:, :k], indices[:, :k]


def _row_sums(weights: torch.Tensor, invariant: bool) -> torch.Tensor:
    """weights [T, k] -> [T, 1], in invariant mode added left to right."""
    if not invariant:
        return weights.sum(dim=-1, keepdim=True)
    total = weights[:, :1]
    for j in range(1, weights.shape[1]):
        total = total + weights[:, j:j + 1]
    return total


def route(hidden: torch.Tensor, gate_weight: torch.Tensor, *, top_k: int, method: str = "greedy",
          n_group: int | None = None, topk_group: int | None = None, norm_topk_prob: bool = False,
          scaling: float = 1.0, kernels: KernelConfig = KernelConfig()) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden: [T, H]; gate_weight: [E, H]. Returns (weights [T, k] float32, experts [T, k] int64).

    Scores are computed in float32 whatever the model dtype, as the reference does. kernels: its
    batch_invariant selects the invariant forms (the module docstring)."""
    invariant = kernels.batch_invariant
    logits = linear(hidden.float(), gate_weight.float(), kernels)  # [T, E]
    scores = logits.softmax(dim=-1, dtype=torch.float32)
    if method == "group_limited_greedy":
        t, e = scores.shape
        group_scores = scores.view(t, n_group, e // n_group).max(dim=-1).values  # [T, G]
        group_idx = _top(group_scores, topk_group, invariant)[1]  # [T, g]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(t, n_group, e // n_group).reshape(t, e)
        scores = scores.masked_fill(~score_mask.bool(), 0.0)
    weights, experts = _top(scores, top_k, invariant)  # [T, k]
    if norm_topk_prob and top_k > 1:
        # DeepSeek-V2's published semantics (vLLM and SGLang follow them); transformers ignores the flag.
        weights = weights / (_row_sums(weights, invariant) + 1e-20)
    return weights * scaling, experts
