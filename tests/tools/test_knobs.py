"""The A/B switches of tools/dev/gpu_probe.py (tools/benchkit/knobs.py): each flag names a field of the
KernelConfig that exists, and the flags build a config with that field set to the value the flag
means and every other field at its default; no module of the engine changes."""
from __future__ import annotations

import argparse
import dataclasses
import importlib

import pytest

from pegainfer.engine.kernels.config import ExpertTilings, HeadTiling, KernelConfig, RowTiling, SampleTiling, Tiling
from tools.benchkit import knobs

DEFAULT = KernelConfig()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    knobs.add_arguments(p)
    return p


def _config(*flags: str) -> tuple[KernelConfig, dict]:
    return knobs.apply(_parser().parse_args(list(flags)))


def test_every_knob_names_an_existing_field():
    for field, _ in knobs.KNOBS.values():
        knobs.get(DEFAULT, field)  # raises AttributeError for a field that does not exist
    assert len(knobs.KNOBS) == 56


def test_no_flags_is_the_default_config():
    config, done = _config()
    assert config == DEFAULT and done == {}


def test_flags_set_their_fields_and_only_those():
    config, done = _config("--argmax-launches", "1")
    assert config == DEFAULT and done == {"argmax_rows": 1024}
    config, done = _config("--argmax-launches", "4", "--router-launches", "2")
    assert done == {"argmax_rows": 0, "router_one_launch": False}
    assert config == dataclasses.replace(DEFAULT, argmax_rows=0, router_one_launch=False)
    assert config.norm_proj_rows == 1
    with pytest.raises(SystemExit):
        _parser().parse_args(["--router-launches", "3"])
    config, _ = _config("--norm-proj-k", "2048", "--norm-proj-warps", "8")
    assert config.norm_proj == RowTiling(block_j=16, block_k=2048, num_warps=8)
    assert config == dataclasses.replace(DEFAULT, norm_proj=RowTiling(16, 2048, 8))
    config, _ = _config("--embed-in-norm", "0", "--norm-proj-rows", "0", "--capture-priority", "0",
                        "--mla-output-rows", "0", "--mla-output-k", "1024", "--mla-output-j", "16",
                        "--mla-output-warps", "8")
    assert config == dataclasses.replace(DEFAULT, embed_in_norm=False, norm_proj_rows=0, capture_priority=0,
                                         mla_output_rows=0, mla_output=RowTiling(16, 1024, 8))


def test_tiling_and_split_flags():
    config, _ = _config("--expert-down-n", "32", "--expert-up-n", "16", "--expert-k", "256", "--split-programs", "8",
                        "--dense-rows", "0", "--dense-n", "64", "--dense-warps", "8", "--expert-stages", "4",
                        "--expert-warps", "8", "--dense-stages", "5", "--one-token-up-n", "128")
    few = dataclasses.replace(DEFAULT.experts.few_rows, down_n=32, up_n=16, block_k=256, num_warps=8)
    assert config.experts == dataclasses.replace(DEFAULT.experts, few_rows=few, one_token_stages=4, one_token_up_n=128)
    assert config.experts.tiling_for(6) == dataclasses.replace(few, num_stages=4, up_n=128)
    assert config.experts.tiling_for(9) == few  # one token's routes only
    assert config.experts.tiling_for(513) == DEFAULT.experts.tiling == Tiling()
    assert config.dense == dataclasses.replace(DEFAULT.dense, up_n=64, num_warps=8, num_stages=5)
    assert config.dense_rows == 0 and config.split_programs == 8
    pytest.importorskip("triton", reason="auto_split lives in a Triton kernel module")
    from pegainfer.engine.kernels import mla_decode
    assert mla_decode.auto_split(1, 1024, config.split_programs) == 128  # 8 splits of 1,024 keys
    assert mla_decode.auto_split(1, 1024, DEFAULT.split_programs) == 32


def test_head_argmax_flags():
    config, done = _config("--head-argmax-rows", "0", "--head-n", "64", "--head-k", "512", "--head-warps", "8",
                           "--head-stages", "4")
    assert config.head_argmax_rows == 0 and done["head_argmax_rows"] == 0
    assert config.head == HeadTiling(block_n=64, block_k=512, num_warps=8, num_stages=4)
    with pytest.raises(SystemExit):
        _parser().parse_args(["--head-argmax-rows", "2"])


def test_sample_flags():
    """--sample-chunks 0: the device sampler one program per row, the A/B's other side against the
    default split over 64 programs (since an H100 timed both); --sample-pivots: the split's count
    thresholds."""
    config, done = _config("--sample-chunks", "0")
    assert done == {"sample.chunks": 0} and config.sample == dataclasses.replace(DEFAULT.sample, chunks=0)
    assert DEFAULT.sample.chunks == 64
    config, done = _config("--sample-pivots", "16", "--sample-chunks", "32")
    assert config.sample == SampleTiling(chunks=32, pivots=16) and config.linear == DEFAULT.linear
    with pytest.raises(ValueError):
        _config("--sample-pivots", "1")


def test_applying_flags_changes_no_module_state():
    """The config is built with dataclasses.replace: the defaults and every kernel module stay as they were."""
    pytest.importorskip("triton", reason="the kernel modules import Triton")
    modules = ["engine.kernels." + m for m in ("argmax", "head_argmax", "norm_proj", "mla_output", "mla_decode",
                                                "moe_route", "moe_experts", "sample", "sample_split")] + ["engine.cuda_graphs"]
    before = {m: dict(vars(importlib.import_module(m))) for m in modules}
    # decode: set together, 128 keys of 16-key steps; the linear's fields one at a time (nested)
    valid = {"decode_block_n": "16", "decode_split_len": "128", "linear_k_chunk": "512", "linear_n_min": "16",
             "linear_n_max": "256", "norm_linear_n": "32",
             "norm_linear_warps": "8"}
    every = [f for flag in knobs.KNOBS
             for f in ("--" + flag.replace("_", "-"), valid.get(flag, "1" if flag in knobs.CHOICES else "7"))]
    config, done = _config(*every)
    assert len(done) == len(knobs.KNOBS) and config != DEFAULT
    assert KernelConfig() == DEFAULT and ExpertTilings() == DEFAULT.experts
    for m in modules:
        assert dict(vars(importlib.import_module(m))) == before[m], m
