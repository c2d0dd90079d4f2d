"""Programmatic dependent launch (engine/kernels/pdl.py), checked on a machine without a GPU: every
Triton kernel of the decode step, launched through its real wrapper at lite's shapes as an H200
would launch it (PDL on), is compiled for sm_90 with Triton's own ptxas, and its PTX must wait on
the previous kernel (griddepcontrol.wait) before any global load, store or atomic, release the next
one only after that wait, and prefetch into L2 (only weights, only before the wait) exactly in the
kernels that read weights no kernel writes. On the CPU and under the interpreter nothing asks for
PDL. That the bits do not change on the GPU is tests/engine/test_gpu_pdl.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import inspect
import re

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction
from engine.kernels import pdl

pdl.enabled = lambda t: True  # as on an H200: every launch asks for PDL
launches = []
def capture(self, *args, grid, warmup, **kwargs):
    launches.append((self, args, kwargs))
JITFunction.run = capture

TYPES = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int32: "*i32", torch.int64: "*i64", torch.float16: "*fp16"}
def compile_ptx(fn, args, kwargs):
    names = list(inspect.signature(fn.fn).parameters)
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages", "launch_pdl") if k in kwargs}
    values = dict(zip(names, args)) | kwargs
    sig, consts = {}, {}
    for p in fn.params:
        v = values[p.name]
        if p.is_constexpr:
            sig[p.name], consts[p.name] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = TYPES[v.dtype]
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            sig[p.name] = "i32"
        else:
            sig[p.name] = "fp32"
    c = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32), options=options)
    return c.asm["ptx"], options

from engine.kernels import argmax, mla_decode, mla_output, mla_prep, moe_experts, moe_route, norm_proj, rmsnorm, ticket
bf = torch.bfloat16
H, I, E, K = 2048, 1408, 64, 6
x = torch.randn(1, H, dtype=bf)
norm_proj.norm_proj((torch.randn(1, K, H), torch.randn(1, H, dtype=bf)), x, torch.ones(H, dtype=bf), 1e-6, torch.randn(3648, H, dtype=bf))
mla_output.proj_norm(torch.randn(1, 2048, dtype=bf), torch.randn(H, 2048, dtype=bf), x, torch.ones(H, dtype=bf), 1e-6, ticket.tickets(1, "cpu"))
totals = torch.zeros(E, dtype=torch.int64)
for t in (1, 32):
    al = moe_experts.Alignment.empty(t, K, totals, ticket.tickets(1, "cpu"))
    moe_route.fused_route(torch.randn(t, H, dtype=bf), torch.randn(E, H), top_k=K, aligned=al)
    moe_experts.fused_experts_token_major(torch.randn(t, H, dtype=bf), torch.randn(E, 2 * I, H, dtype=bf), torch.randn(E, H, I, dtype=bf), torch.rand(t, K), al)
cache = torch.zeros(4, 64, 576, dtype=bf)
for b in (1, 64):
    pos = torch.zeros(b, dtype=torch.int64)
    q = mla_prep.mla_prep(torch.randn(b, 16 * 192, dtype=bf), torch.randn(b, 576, dtype=bf), torch.ones(512, dtype=bf), torch.randn(16, 128, 512, dtype=bf), torch.ones(64, 32, dtype=torch.complex64), pos, pos, cache)
    mla_decode.mla_decode(torch.randn(b, 16, 576, dtype=bf), cache, pos, pos + 1, 64, 0.1, 512, w_uv_t=torch.randn(16, 512, 128, dtype=bf))
rmsnorm.rmsnorm(torch.randn(4, H, dtype=bf), torch.ones(H, dtype=bf), 1e-6, residual=torch.randn(4, H, dtype=bf))
rmsnorm.moe_rmsnorm(torch.randn(4, K, H), torch.randn(4, H, dtype=bf), torch.ones(H, dtype=bf), 1e-6, residual=torch.randn(4, H, dtype=bf))
argmax.argmax(torch.randn(1, 102400), ticket.tickets(1, "cpu"))

MEM = re.compile(r"^\s*(@%p\d+\s+)?(ld\.global|st\.global|atom\.|red\.|ld\.volatile|cp\.async|ld\.cg)")
PREFETCHING = {"_norm_proj_kernel", "_proj_norm_kernel", "_route_small_kernel", "_logits_kernel", "_prep_kernel",
               "_merge_row_kernel", "_merge_kernel"}
seen = set()
for fn, args, kwargs in launches:
    name = fn.__name__
    ptx, options = compile_ptx(fn, args, dict(kwargs))
    assert options.get("launch_pdl") is True, name
    lines = ptx.splitlines()
    wait = [i for i, l in enumerate(lines) if "griddepcontrol.wait" in l]
    rel = [i for i, l in enumerate(lines) if "griddepcontrol.launch_dependents" in l]
    assert len(wait) == 1 and len(rel) == 1 and wait[0] < rel[0], (name, wait, rel)
    early = [l.strip() for l in lines[:wait[0]] if MEM.match(l)]
    assert not early, (name, early[:3])  # nothing read or written before the wait but L2 prefetches
    prefetches = sum("prefetch.global.L2" in l for l in lines)
    assert (prefetches > 0) == (name in PREFETCHING), (name, prefetches)
    assert all("prefetch.global.L2" not in l for l in lines[wait[0]:]), name
    seen.add(name)
assert seen == PREFETCHING | {"_gate_up_kernel", "_down_kernel", "_gate_up_row_kernel", "_down_row_kernel",
                              "_select_kernel", "_align_kernel", "_split_kernel", "_rmsnorm_kernel",
                              "_moe_rmsnorm_kernel", "_argmax_kernel"}, seen
print("ok")
'''


def test_every_decode_kernel_waits_before_it_touches_memory_in_its_sm90_ptx():
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]


def test_nothing_asks_for_pdl_on_the_cpu(monkeypatch):
    pytest.importorskip("triton")
    from engine.engine import dependent_launch
    from engine.kernels import pdl
    t = torch.zeros(2)
    assert not pdl.enabled(t)
    assert pdl.waits(t) == {"GDC": False}
    assert pdl.options(t) == {"GDC": False, "PREFETCH": False}  # no launch_pdl keyword without PDL
    assert dependent_launch(t) == "off"
    monkeypatch.setattr(pdl, "enabled", lambda t: True)
    assert pdl.options(t) == {"GDC": True, "launch_pdl": True, "PREFETCH": True}
    assert pdl.options(t, prefetch=False)["PREFETCH"] is False
    monkeypatch.setattr(pdl, "PREFETCH", False)
    assert pdl.options(t)["PREFETCH"] is False
