"""The SwiGLU MLP of the dense first layer(s) and of a MoE layer's shared experts."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pegainfer.engine.kernels.config import KernelConfig
from pegainfer.engine.kernels import pointwise
from pegainfer.engine.kernels.linear import linear


class MLP:
    """SwiGLU MLP: the dense first layer(s) and the shared experts."""

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, kernels: KernelConfig):
        self.gate_up = torch.cat([gate, up])  # [2I, H]; gate and up below are views of it
        i = gate.shape[0]
        self.gate, self.up, self.down = self.gate_up[:i], self.gate_up[i:], down  # [I, H], [I, H], [H, I]
        self.kernels = kernels
        self._dense_rows = None  # the one-launch SwiGLU's index tensors per row count (CUDA, few rows)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H] -> [T, H], as the reference computes it (prompts, the torch decode step)."""
        k = self.kernels
        silu = pointwise.silu if k.batch_invariant else F.silu
        return linear(silu(linear(x, self.gate, k)) * linear(x, self.up, k), self.down, k)

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """The decode step's form. With the Triton kernels: one projection for gate and up and one
        launch for SiLU * up; at up to KernelConfig.dense_rows rows gate, up and SiLU * up in one
        launch (engine/kernels/moe_experts.py dense_swiglu). Otherwise the reference's ops."""
        k = self.kernels
        if not k.triton:
            return self(x)
        if x.shape[0] <= k.dense_rows:
            from pegainfer.engine.kernels import moe_experts
            self._dense_rows = self._dense_rows or moe_experts.DenseRows()
            act = moe_experts.dense_swiglu(x, self.gate_up, self._dense_rows(x.shape[0], x.device), k.dense)
        else:
            from pegainfer.engine.kernels.swiglu import swiglu
            act = swiglu(linear(x, self.gate_up, k))
        return linear(act, self.down, k)
