"""engine/kernels/config.py: the one kernel configuration is frozen and hashable (Triton takes its
tilings as constexpr arguments), its defaults are the measured values the kernels ran with, and
on_device clears the Triton switch wherever the kernels cannot run and, in batch-invariant mode, the
one-row kernels' row counts."""
from __future__ import annotations

import dataclasses

import pytest

from pegainfer.engine.kernels.config import (ExpertTilings, HeadTiling, KernelConfig, LinearTiling, RowTiling,
                                             SampleTiling, Tiling)


def test_frozen_and_hashable():
    k = KernelConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        k.argmax_rows = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        k.experts.max_routes = 1  # type: ignore[misc]
    assert hash(k) == hash(KernelConfig()) and len({k, KernelConfig(), dataclasses.replace(k, split_programs=8)}) == 2


def test_defaults_are_the_measured_values():
    k = KernelConfig()
    assert (k.triton, k.capture_priority, k.argmax_rows, k.head_argmax_rows, k.norm_proj_rows, k.embed_in_norm,
            k.router_one_launch, k.mla_output_rows, k.split_programs, k.row_merge_max_batch, k.dense_rows) == (
        True, -1, 1024, 1, 1, True, True, 1, 264, 32, 1)
    assert k.head == HeadTiling(64, 256, 8, 3)
    assert k.norm_proj == RowTiling(16, 2048, 4) and k.mla_output == RowTiling(8, 512, 4)
    assert k.dense == Tiling(block_m=16, block_k=128, up_n=32, down_n=64, num_warps=4, num_stages=4)
    assert k.experts == ExpertTilings(Tiling(), Tiling(block_m=16), 512, 8, 4, 32, 2048,
                                     Tiling(128, 128, 64, 128, 8, 3), 2048)
    assert k.linear == LinearTiling(16, 256, 64, 8, 64, 256, 32, 128, 264, 4, 3)  # wide rows: linear_blockm.py on the H200
    # the split sampler by default (chunks 64: perf-notes row 47, measured on an H100)
    assert k.sample == SampleTiling(chunks=64, block_v=2048, pivots=8, one_pivots=4, cap=512, num_warps=8)


@pytest.mark.parametrize("bad", [{"chunks": -1}, {"block_v": 1000}, {"cap": 300}, {"pivots": 1}])
def test_a_sample_tiling_the_kernels_cannot_take_is_refused(bad):
    with pytest.raises(ValueError, match="SampleTiling"):
        SampleTiling(**bad)


@pytest.mark.parametrize("cuda,bf16,imports", [(c, b, i) for c in (0, 1) for b in (0, 1) for i in (0, 1)])
def test_on_device_keeps_triton_only_where_it_runs(cuda, bf16, imports):
    k = KernelConfig(split_programs=8, batch_invariant=False)
    on = k.on_device(bool(cuda), bool(bf16), bool(imports))
    assert on.triton == bool(cuda and bf16 and imports)
    assert dataclasses.replace(on, triton=True) == k  # nothing else changes
    assert not KernelConfig(triton=False).on_device(True, True, True).triton  # switched off stays off


ONE_ROW = ("norm_proj_rows", "mla_output_rows", "dense_rows", "head_argmax_rows")


@pytest.mark.parametrize("cuda,bf16,imports", [(c, b, i) for c in (0, 1) for b in (0, 1) for i in (0, 1)])
def test_batch_invariance_turns_the_one_row_kernels_off(cuda, bf16, imports):
    """They sum a row in another order than the multi-row ops: a step of one row would give other
    bits. Only they change: the router's one launch and the argmax give the same bits at every row
    count and stay."""
    k = KernelConfig(split_programs=8, norm_proj_rows=4)
    assert k.batch_invariant  # the default
    on = k.on_device(bool(cuda), bool(bf16), bool(imports))
    assert on.triton == bool(cuda and bf16 and imports)
    assert [getattr(on, f) for f in ONE_ROW] == [0, 0, 0, 0]
    assert dataclasses.replace(on, triton=True, **{f: getattr(k, f) for f in ONE_ROW}) == k
    assert on.router_one_launch and on.argmax_rows == k.argmax_rows and on.experts == k.experts
    assert on.on_device(bool(cuda), bool(bf16), bool(imports)) == on  # resolving twice changes nothing
