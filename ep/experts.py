"""One rank's routed experts for every MoE layer: stacked weights and the expert MLP over the routes
of a plan that this rank owns, with the expert kernel every backend and every rank chooses the same
way (ExpertKernel.choose) and the tilings of the KernelConfig (engine/kernels/config.py).

Batch invariance (ExpertKernel.batch_invariant, from KernelConfig.batch_invariant): a route's output
depends only on its row, its expert and its weight, never on how many routes share its expert, how
many the step has or which rank runs it. The Triton MLP gives that for every size (each row's dot
products in a fixed K order whatever its neighbours; the tiling by the step's routes keeps
block_k), so it runs at every size, with no hand-off to grouped GEMMs (another order); the per-expert
loop runs each expert's rows through the batch-invariant linear's torch form (engine/kernels/linear.py
blocked) and its SwiGLU elementwise in an order that no row count moves (_swiglu); grouped GEMMs,
which pick their algorithm by the rows, are never chosen."""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from pegainfer.engine.kernels import pointwise, triton_available
from pegainfer.engine.kernels.config import ExpertTilings
from pegainfer.engine.kernels.linear import blocked
from pegainfer.ep.grouped import grouped_linear, grouped_mm_available


@dataclasses.dataclass(frozen=True, slots=True)
class ExpertKernel:
    """How a shard runs its routes: "triton" (the fused Triton MLP, engine/kernels/moe_experts.py;
    without batch_invariant, calls of steps above tilings.max_routes routes, prompt chunks, go to
    grouped GEMMs), "grouped_mm" (torch._grouped_mm) or "loop" (the per-expert loop, the reference
    order), the tilings, and whether a route's bits must not depend on the step (the module
    docstring; KernelConfig.batch_invariant)."""
    name: str
    tilings: ExpertTilings = ExpertTilings()
    batch_invariant: bool = True

    @classmethod
    def choose(cls, device: torch.device, dtype: torch.dtype, triton: bool, tilings: ExpertTilings, *,
               batch_invariant: bool = True) -> ExpertKernel:
        """For bfloat16 on CUDA the Triton MLP where `triton` and Triton imports, else grouped GEMMs
        where they run and batch invariance is not asked for; otherwise the loop. Every backend and
        every rank asks here, so each expert's rows see the same kernel whichever rank owns them."""
        if dtype != torch.bfloat16 or device.type != "cuda":
            return cls("loop", tilings, batch_invariant)
        if triton and triton_available():
            return cls("triton", tilings, batch_invariant)
        grouped = grouped_mm_available(device) and not batch_invariant
        return cls("grouped_mm" if grouped else "loop", tilings, batch_invariant)



class ExpertShard:
    """Experts [lo, hi) of every MoE layer. w13[layer]: [n, 2I, H] (gate rows then up rows, as the
    reference fuses them); w2[layer]: [n, H, I]."""

    def __init__(self, experts: range, w13: dict[int, torch.Tensor], w2: dict[int, torch.Tensor]):
        self.experts = experts
        self.w13 = w13
        self.w2 = w2

    @classmethod
    def from_tensors(cls, experts: range, tensors: dict[str, torch.Tensor], moe_layers: list[int]) -> ExpertShard:
        """Stack per-expert checkpoint tensors (popped from `tensors` to free them as we go)."""
        w13, w2 = {}, {}
        for layer in moe_layers:
            def take(e: int, proj: str) -> torch.Tensor:
                return tensors.pop(f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight")
            w13[layer] = torch.stack([torch.cat([take(e, "gate_proj"), take(e, "up_proj")]) for e in experts])
            w2[layer] = torch.stack([take(e, "down_proj") for e in experts])
        return cls(experts, w13, w2)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for d in (self.w13, self.w2) for t in d.values())

    def kernel_for(self, device: torch.device, triton: bool, tilings: ExpertTilings, *,
                   batch_invariant: bool = True) -> ExpertKernel:
        """The expert kernel for this shard's weights on `device` (ExpertKernel.choose)."""
        dtype = next(iter(self.w13.values())).dtype if self.w13 else torch.bfloat16
        return ExpertKernel.choose(device, dtype, triton, tilings, batch_invariant=batch_invariant)

    def run_routes(self, layer: int, hidden: torch.Tensor, token_index: torch.Tensor, weight: torch.Tensor,
                   counts: list[int] | torch.Tensor, kernel: ExpertKernel, total_routes: int | None = None
                   ) -> torch.Tensor:
        """The weighted expert outputs of this shard's routes with the chosen kernel; counts: routes
        per owned expert, a device tensor (no host sync on the triton and grouped paths) or host ints.
        total_routes: the step's routes on all ranks (default: these); the triton kernel picks its
        tiling by this number, which every rank shares, so a route's bits do not depend on how the
        step was split between ranks, and, without batch invariance, hands steps above
        kernel.tilings.max_routes to grouped GEMMs. A "grouped_mm" kernel asked for batch invariance
        runs the loop (choose never makes one)."""
        invariant = kernel.batch_invariant
        if kernel.name == "triton" or (kernel.name == "grouped_mm" and not invariant):
            if not isinstance(counts, torch.Tensor):
                counts = torch.tensor(counts, dtype=torch.int64, device=hidden.device)
            if kernel.name == "triton":
                from pegainfer.engine.kernels import moe_experts
                total = token_index.shape[0] if total_routes is None else total_routes
                if invariant or total <= kernel.tilings.max_routes or not grouped_mm_available(hidden.device):
                    return moe_experts.fused_experts(hidden, self.w13[layer], self.w2[layer], token_index, weight,
                                                     counts, kernel.tilings.tiling_for(total))
            return self._run_grouped(layer, hidden, token_index, weight, counts, kernel.name == "triton")
        return self.run(layer, hidden, token_index, weight,
                        counts.tolist() if isinstance(counts, torch.Tensor) else counts, batch_invariant=invariant)

    def run_token_major(self, layer: int, hidden: torch.Tensor, weights: torch.Tensor, aligned,
                        kernel: ExpertKernel) -> torch.Tensor:
        """Every route of every token when this shard owns all experts (the triton kernel only):
        weights [T, k] float32 -> [T, k, H] float32; aligned: the engine.kernels.moe_experts.Alignment
        the router kernel filled (routes by expert; it counted them into the model's route counts)."""
        from pegainfer.engine.kernels.moe_experts import fused_experts_token_major
        return fused_experts_token_major(hidden, self.w13[layer], self.w2[layer], weights, aligned,
                                         kernel.tilings.tiling_for(weights.numel()))

    def _run_grouped(self, layer: int, hidden: torch.Tensor, token_index: torch.Tensor, weight: torch.Tensor,
                     counts: torch.Tensor, triton: bool = False) -> torch.Tensor:
        """Two grouped GEMMs over the rows sorted by expert. counts: [n] int on the device.
        triton: SwiGLU and the weighting as one-pass Triton kernels (the shard's kernel is "triton")."""
        offs = torch.cumsum(counts, 0, dtype=torch.int32)  # [n]
        x = hidden.index_select(0, token_index)  # [r, H]
        gate_up = grouped_linear(x, self.w13[layer], offs)  # [r, 2I]
        if not (triton and triton_available()):
            gate, up = gate_up.chunk(2, dim=-1)  # [r, I] each
            return grouped_linear(F.silu(gate) * up, self.w2[layer], offs) * weight[:, None]
        from pegainfer.engine.kernels.moe_combine import weigh
        from pegainfer.engine.kernels.swiglu import swiglu
        # SwiGLU as the Triton expert kernels compute it (within a float32 ulp of F.silu before rounding)
        y = grouped_linear(swiglu(gate_up), self.w2[layer], offs)  # [r, H]
        return weigh(y, weight)

    def run(self, layer: int, hidden: torch.Tensor, token_index: torch.Tensor, weight: torch.Tensor,
            counts: list[int], *, batch_invariant: bool = True) -> torch.Tensor:
        """The weighted expert outputs of this shard's routes.

        hidden: [T, H]; token_index, weight: [r] routes of this shard in execution order;
        counts: routes per owned expert (host ints, len = len(self.experts)). Returns [r, H] float32.
        batch_invariant: each expert's rows through engine/kernels/linear.py blocked and _swiglu,
        so a route's bits do not depend on how many rows its expert holds or where it sits."""
        w13, w2 = self.w13[layer], self.w2[layer]
        lin = blocked if batch_invariant else F.linear
        out = torch.empty(token_index.shape[0], hidden.shape[1], dtype=torch.float32, device=hidden.device)
        start = 0
        for i, n in enumerate(counts):
            if n == 0:
                continue
            sl = slice(start, start + n)
            x = hidden[token_index[sl]]  # [n, H]
            gate_up = lin(x, w13[i])  # [n, 2I]
            if batch_invariant:
                act = _swiglu(gate_up)  # [n, I]
            else:
                gate, up = gate_up.chunk(2, dim=-1)  # [n, I] each
                act = F.silu(gate) * up
            y = lin(act, w2[i])  # [n, H]
            out[sl] = y * weight[sl, None]
            start += n
        return out


def _swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """[n, 2I] (gate columns, then up) -> SiLU(gate) * up [n, I], every element by one code path.
    torch's CPU loops run the vector body over most of a tensor and a scalar tail (another exp, bits
    apart in float32) at the end of each chunk, and the chunks follow the tensor's size, so F.silu of
    a row would depend on how many rows share the call; read through a stride-2 view, every element
    takes the scalar path. (The product is one rounding either way; CUDA computes every element
    alike.)"""
    i = gate_up.shape[1] // 2
    return pointwise.silu(gate_up[:, :i]) * gate_up[:, i:]
