"""The A/B switches of tools/dev/gpu_probe.py (tools/benchkit/knobs.py): each flag names an engine
constant that exists, sets it to the value its flag means, and leaves the rest alone."""
from __future__ import annotations

import argparse
import dataclasses
import importlib

import pytest

from tools.benchkit import knobs

pytest.importorskip("triton", reason="the switches name Triton kernel modules")


def test_every_knob_names_an_existing_constant():
    for module, name, _ in knobs.KNOBS.values():
        assert hasattr(importlib.import_module(module), name), (module, name)


def test_flags_set_their_constants_and_only_those(monkeypatch):
    from engine.kernels import argmax, mla_output, moe_route, norm_proj
    for module, name in ((argmax, "MAX_ROWS"), (moe_route, "ONE_LAUNCH"), (norm_proj, "MAX_ROWS"),
                         (mla_output, "MAX_ROWS"), (norm_proj, "BLOCK_K"), (norm_proj, "NUM_WARPS")):
        monkeypatch.setattr(module, name, getattr(module, name))  # restored after the test
    p = argparse.ArgumentParser()
    knobs.add_arguments(p)
    rows = argmax.MAX_ROWS
    assert knobs.apply(p.parse_args(["--argmax-launches", "1"])) == {"engine.kernels.argmax.MAX_ROWS": rows}
    a = p.parse_args(["--argmax-launches", "4", "--router-launches", "2"])
    done = knobs.apply(a)
    assert done == {"engine.kernels.argmax.MAX_ROWS": 0, "engine.kernels.moe_route.ONE_LAUNCH": False}
    assert argmax.MAX_ROWS == 0 and moe_route.ONE_LAUNCH is False and norm_proj.MAX_ROWS == 1
    with pytest.raises(SystemExit):
        p.parse_args(["--router-launches", "3"])
    knobs.apply(p.parse_args(["--norm-proj-k", "2048", "--norm-proj-warps", "8"]))
    assert (norm_proj.BLOCK_K, norm_proj.NUM_WARPS) == (2048, 8)


def test_tiling_and_split_flags(monkeypatch):
    from engine.kernels import mla_decode, moe_experts
    for name in ("FEW_ROWS_TILING", "DENSE_TILING", "DENSE_MAX_ROWS", "ONE_TOKEN_STAGES", "ONE_TOKEN_UP_N"):
        monkeypatch.setattr(moe_experts, name, getattr(moe_experts, name))
    monkeypatch.setattr(mla_decode, "SPLIT_PROGRAMS", mla_decode.SPLIT_PROGRAMS)
    p = argparse.ArgumentParser()
    knobs.add_arguments(p)
    few, dense = moe_experts.FEW_ROWS_TILING, moe_experts.DENSE_TILING
    knobs.apply(p.parse_args(["--expert-down-n", "32", "--expert-up-n", "16", "--expert-k", "256",
                              "--split-programs", "8", "--dense-rows", "0", "--dense-n", "64", "--dense-warps", "8",
                              "--expert-stages", "4", "--expert-warps", "8", "--dense-stages", "5",
                              "--one-token-up-n", "128"]))
    assert moe_experts.FEW_ROWS_TILING == dataclasses.replace(few, down_n=32, up_n=16, block_k=256, num_warps=8)
    assert moe_experts.tiling_for(6) == dataclasses.replace(moe_experts.FEW_ROWS_TILING, num_stages=4, up_n=128)
    assert moe_experts.tiling_for(9) == moe_experts.FEW_ROWS_TILING  # one token's routes only
    assert moe_experts.DENSE_TILING == dataclasses.replace(dense, up_n=64, num_warps=8, num_stages=5)
    assert moe_experts.DENSE_MAX_ROWS == 0
    assert mla_decode.auto_split(1, 1024) == 128  # 8 splits of 1,024 keys


def test_head_argmax_flags(monkeypatch):
    from engine.kernels import head_argmax
    for name in ("MAX_ROWS", "TILING"):
        monkeypatch.setattr(head_argmax, name, getattr(head_argmax, name))
    p = argparse.ArgumentParser()
    knobs.add_arguments(p)
    tiling = head_argmax.TILING
    done = knobs.apply(p.parse_args(["--head-argmax-rows", "0", "--head-n", "64", "--head-k", "512",
                                     "--head-warps", "8", "--head-stages", "4"]))
    assert head_argmax.MAX_ROWS == 0 and done["engine.kernels.head_argmax.MAX_ROWS"] == 0
    assert head_argmax.TILING == dataclasses.replace(tiling, block_n=64, block_k=512, num_warps=8, num_stages=4)
    with pytest.raises(SystemExit):
        p.parse_args(["--head-argmax-rows", "2"])
