"""The expert kernels' L2 prefetch (engine/kernels/moe_experts.py _l2_prefetch_rows) without a GPU:
compiled for the H200 (sm_90: Triton's compiler and ptxas, no device) the gate-up and down kernels
ask L2 for every line of their weight rows with PREFETCH and for none without; off the GPU (the
interpreter runs no PTX) the launch never asks for it."""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")

from engine.kernels import moe_experts  # noqa: E402


def _ptx(kernel, sig: dict, constexprs: dict) -> str:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    src = ASTSource(fn=kernel, signature={**sig, **{k: "constexpr" for k in constexprs}}, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


ROUTES = {"order_ptr": "*i32", "starts_ptr": "*i32", "counts_ptr": "*i32", "active_ptr": "*i32"}


@pytest.mark.parametrize("prefetch", [True, False])
def test_the_expert_kernels_compile_to_l2_prefetches(prefetch):
    tiles = dict(BY_ROUTE=True, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128)
    extra = dict(PREFETCH=prefetch, LINES=32, LINE_ELEMS=64)
    up = _ptx(moe_experts._gate_up_kernel, {"x_ptr": "*bf16", "w_ptr": "*bf16", **ROUTES, "act_ptr": "*bf16",
                                            "H": "i32", "I": "i32", "stride_we": "i32", "TOPK": "i32"},
              {**tiles, **extra})
    down = _ptx(moe_experts._down_kernel, {"act_ptr": "*bf16", "w_ptr": "*bf16", **ROUTES, "weight_ptr": "*fp32",
                                           "out_ptr": "*fp32", "H": "i32", "I": "i32", "stride_we": "i32"},
                {**tiles, **extra})
    # 64 rows x 32 lines over 128 threads: 16 prefetches a thread per matrix (gate and up: two)
    assert up.count("prefetch.global.L2 [") == (32 if prefetch else 0)
    assert down.count("prefetch.global.L2 [") == (16 if prefetch else 0)


def test_no_prefetch_off_the_gpu(monkeypatch):
    import torch
    monkeypatch.setattr(moe_experts, "EXPERT_PREFETCH", True)
    assert moe_experts._prefetch_args(True, torch.zeros(2, 4, 8, dtype=torch.bfloat16), 2048) == {}
