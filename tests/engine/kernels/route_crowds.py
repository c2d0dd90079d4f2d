"""Crowds for the batch-invariance tests of the router and the routed experts
(tests/engine/kernels/test_moe_route.py, test_moe_experts.py, tests/ep/test_experts.py): a probe row
placed at a random position among random neighbours, for batch sizes from 1 to 256."""
from __future__ import annotations

import torch

# every size from 1 to 256 that moves a boundary: the router's one-launch limit (16), its selection
# blocks (16), the 16- and 32-row blocks of the expert kernels and of the batch-invariant linear
SIZES = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65, 100, 127, 128, 129, 200, 255, 256)
FEW_SIZES = (1, 2, 7, 16, 17, 33, 64, 256)  # for Triton's interpreter, one program at a time


def crowd(probe: torch.Tensor, size: int, gen: torch.Generator, scale: float = 1.0) -> tuple[torch.Tensor, int]:
    """probe [1, H] among size - 1 random rows (scaled by `scale`) at a random position:
    (rows [size, H] in probe's dtype and device, the probe's position)."""
    rows = (torch.randn(size, probe.shape[1], generator=gen) * scale).to(probe.dtype).to(probe.device)
    pos = int(torch.randint(size, (1,), generator=gen))
    rows[pos] = probe[0]
    return rows, pos


def routes_crowd(probe_experts: torch.Tensor, size: int, n_experts: int, pos: int, gen: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The probe's k experts [k] (ascending) at row `pos` of `size` tokens, each other token k
    distinct random experts, ascending as the router writes them: (experts [size, k] int64, weights
    [size, k] float32: random, the probe's probe_weights)."""
    k = probe_experts.shape[0]
    experts = torch.stack([torch.randperm(n_experts, generator=gen)[:k] for _ in range(size)]).sort(dim=1).values
    experts[pos] = probe_experts.cpu()
    weights = torch.rand(size, k, generator=gen)
    weights[pos] = probe_weights(k)
    return experts.to(probe_experts.device), weights.to(probe_experts.device)


def probe_weights(k: int) -> torch.Tensor:
    """The probe's route weights [k] float32."""
    return 0.5 / torch.arange(1, k + 1, dtype=torch.float32)


def listing(experts: torch.Tensor, n_experts: int, totals: torch.Tensor | None = None):
    """The engine.kernels.moe_experts.Alignment the router kernel makes for these routes (experts
    [T, k], each row ascending): expert e's route ids at order[e*T...], ascending; every expert its
    own slot (the form above 16 tokens)."""
    from pegainfer.engine.kernels.moe_experts import Alignment
    t, _ = experts.shape
    dev = experts.device
    flat = experts.reshape(-1)  # [T*k] token-major
    counts = torch.bincount(flat, minlength=n_experts).to(torch.int32)  # [E]
    order = torch.zeros(n_experts * t, dtype=torch.int32, device=dev)
    for e in range(n_experts):
        ids = torch.nonzero(flat == e).flatten().to(torch.int32)
        order[e * t: e * t + ids.shape[0]] = ids
    starts = torch.arange(n_experts, dtype=torch.int32, device=dev) * t
    totals = torch.zeros(n_experts, dtype=torch.int64, device=dev) if totals is None else totals
    return Alignment(order, starts, counts, torch.arange(n_experts, dtype=torch.int32, device=dev), totals, n_experts)
