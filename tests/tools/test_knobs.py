"""The A/B switches of tools/gpu_probe.py (tools/benchkit/knobs.py): each flag names an engine
constant that exists, sets it to the value its flag means, and leaves the rest alone."""
from __future__ import annotations

import argparse
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
                         (mla_output, "MAX_ROWS")):
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


def test_schedule_tiling_and_split_flags(monkeypatch):
    from engine.kernels import mla_decode, moe_experts
    from ep import moe
    for module, name in ((moe, "SHARED_SCHEDULE"), (moe_experts, "FEW_ROWS_TILING"), (mla_decode, "SPLIT_PROGRAMS")):
        monkeypatch.setattr(module, name, getattr(module, name))
    p = argparse.ArgumentParser()
    knobs.add_arguments(p)
    before = moe_experts.FEW_ROWS_TILING
    knobs.apply(p.parse_args(["--shared-schedule", "3", "--expert-down-n", "32", "--expert-up-n", "16",
                              "--split-programs", "8"]))
    assert moe.SHARED_SCHEDULE == "both" and moe.SHARED_SCHEDULES["both"] == (True, True)
    assert moe_experts.FEW_ROWS_TILING == moe_experts.Tiling(**{**{f: getattr(before, f) for f in before.__slots__},
                                                                "down_n": 32, "up_n": 16})
    assert mla_decode.auto_split(1, 1024) == 128  # 8 splits of 1,024 keys
    with pytest.raises(SystemExit):
        p.parse_args(["--shared-schedule", "4"])
