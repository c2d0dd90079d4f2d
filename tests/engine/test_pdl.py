"""Programmatic dependent launch (engine/kernels/pdl.py), checked on a machine without a GPU: every
Triton kernel of a one-row decode step, launched through its real wrapper at lite's shapes as an
H200 would launch it, asks for PDL and is compiled for sm_90 with Triton's own ptxas; its PTX must
wait on the previous kernel (griddepcontrol.wait) and release the next one after that, both before
any global load, store or atomic. At four rows no launch asks for it (MAX_ROWS), and on the CPU and
under the interpreter none does. That the bits do not change on the GPU is tests/engine/test_gpu_pdl.py."""
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

pdl.enabled = lambda t, rows=1: rows <= pdl.MAX_ROWS  # as on an H200
launches = []
def capture(self, *args, grid, warmup, **kwargs):
    launches.append((self, args, kwargs))
JITFunction.run = capture

TYPES = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int32: "*i32", torch.int64: "*i64"}
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
    c = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                       options=options)
    return c.asm["ptx"]

from engine.kernels import argmax, mla_decode, mla_output, mla_prep, moe_experts, moe_route, norm_proj, rmsnorm, ticket
bf = torch.bfloat16
H, I, E, K = 2048, 1408, 64, 6
x = torch.randn(1, H, dtype=bf)
cache = torch.zeros(4, 64, 576, dtype=bf)
totals = torch.zeros(E, dtype=torch.int64)


def decode_kernels(t, ticketed=True):
    # every Triton kernel a decode step of t rows launches, through the real wrappers, at lite's shapes
    xt = torch.randn(t, H, dtype=bf)
    if t == 1:
        norm_proj.norm_proj((torch.randn(1, K, H), torch.randn(1, H, dtype=bf)), x, torch.ones(H, dtype=bf), 1e-6,
                            torch.randn(3648, H, dtype=bf))
    pos = torch.zeros(t, dtype=torch.int64)
    mla_prep.mla_prep(torch.randn(t, 16 * 192, dtype=bf), torch.randn(t, 576, dtype=bf), torch.ones(512, dtype=bf),
                      torch.randn(16, 128, 512, dtype=bf), torch.ones(64, 32, dtype=torch.complex64), pos, pos, cache)
    for merge in ("row", "block"):
        mla_decode.mla_decode(torch.randn(t, 16, 576, dtype=bf), cache, pos, pos + 1, 64, 0.1, 512,
                              w_uv_t=torch.randn(16, 512, 128, dtype=bf), merge=merge)
    mla_output.proj_norm(torch.randn(t, 2048, dtype=bf), torch.randn(H, 2048, dtype=bf), xt, torch.ones(H, dtype=bf),
                         1e-6, ticket.tickets(t, "cpu"))
    al = moe_experts.Alignment.empty(t, K, totals, ticket.tickets(1, "cpu") if ticketed else None)
    moe_route.fused_route(xt, torch.randn(E, H), top_k=K, aligned=al)
    moe_experts.fused_experts_token_major(xt, torch.randn(E, 2 * I, H, dtype=bf), torch.randn(E, H, I, dtype=bf),
                                         torch.rand(t, K), al)
    for tiling in (moe_experts.ROW_TILING, moe_experts.FEW_ROWS_TILING):
        moe_experts.fused_experts_token_major(xt, torch.randn(E, 2 * I, H, dtype=bf), torch.randn(E, H, I, dtype=bf),
                                             torch.rand(t, K), al, tiling=tiling)
    rmsnorm.rmsnorm(xt, torch.ones(H, dtype=bf), 1e-6, residual=xt)
    rmsnorm.moe_rmsnorm(torch.randn(t, K, H), xt, torch.ones(H, dtype=bf), 1e-6, residual=xt)
    argmax.argmax(torch.randn(t, 102400), ticket.tickets(t, "cpu"))


decode_kernels(1)
decode_kernels(1, ticketed=False)  # the router's two-launch form
one_row = [l for l in launches]
launches.clear()
decode_kernels(4)
assert all(kw == {} or kw.get("GDC") is False and "launch_pdl" not in kw
           for _, _, kw in [(f, a, {k: v for k, v in kw.items() if k in ("GDC", "launch_pdl")}) for f, a, kw in launches])
assert len(launches) > 10

MEM = re.compile(r"^\s*(@%p\d+\s+)?(ld\.global|st\.global|atom\.|red\.|ld\.volatile|cp\.async|prefetch)")
seen = set()
for fn, args, kwargs in one_row:
    name = fn.__name__
    assert kwargs.get("launch_pdl") is True and kwargs.get("GDC") is True, name
    if name in seen:
        continue
    lines = compile_ptx(fn, args, dict(kwargs)).splitlines()
    wait = [i for i, l in enumerate(lines) if "griddepcontrol.wait" in l]
    rel = [i for i, l in enumerate(lines) if "griddepcontrol.launch_dependents" in l]
    assert len(wait) == 1 and len(rel) == 1 and wait[0] < rel[0], (name, wait, rel)
    early = [l.strip() for l in lines[:rel[0]] if MEM.match(l)]
    assert not early, (name, early[:3])  # nothing read or written before the wait and the release
    seen.add(name)
assert seen == {"_norm_proj_kernel", "_prep_kernel", "_split_kernel", "_merge_row_kernel", "_merge_kernel",
                "_proj_norm_kernel", "_route_small_kernel", "_logits_kernel", "_select_kernel", "_gate_up_kernel",
                "_down_kernel", "_gate_up_row_kernel", "_down_row_kernel", "_rmsnorm_kernel", "_moe_rmsnorm_kernel",
                "_argmax_kernel"}, seen
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
    assert not pdl.enabled(t, 1)
    assert pdl.waits(t, 1) == {"GDC": False}  # no launch_pdl keyword without PDL
    assert dependent_launch(t) == 0
    monkeypatch.setattr(pdl, "_capable", lambda index: True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert pdl.waits(t, 1) == {"GDC": True, "launch_pdl": True} and pdl.waits(t, 2) == {"GDC": False}
    assert dependent_launch(t) == pdl.MAX_ROWS == 1
    monkeypatch.setattr(pdl, "MAX_ROWS", 0)
    assert pdl.waits(t, 1) == {"GDC": False} and dependent_launch(t) == 0
