"""The exactness and failure gates on CUDA (skipped without a GPU): host-staged with several ranks on
one shared GPU, nccl with one GPU per rank (needs as many GPUs), and the refusal of more nccl ranks
than GPUs. Run on a GPU machine: pytest tests/ep/test_gpu.py"""
from __future__ import annotations

import dataclasses
import os
import signal
import time

import pytest
import torch

from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.generate import generate
from pegainfer.ep.backend import RankFailure
from pegainfer.ep.nccl_runtime import NcclRuntimeError
from tests.ep.conftest import PROMPTS, random_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def _spec(**fields) -> EngineSpec:
    if "cuda_graphs" in {f.name for f in dataclasses.fields(EngineSpec)}:
        fields.setdefault("cuda_graphs", False)  # compare the eager paths: multi-rank backends sync per layer
    fields.setdefault("kv_cache_tokens", 8 * 4096)  # not the default, most of the free memory: several engines per test
    return EngineSpec(random_preset="tiny", device="cuda:0", **fields)


def _assert_equal_to_local(dtype: str, **backend_fields) -> None:
    local = build_engine(_spec(dtype=dtype))
    other = build_engine(_spec(dtype=dtype, **backend_fields))
    try:
        want = [g.token_ids for g in generate(local, PROMPTS, 12, ignore_eos=True)]
        assert [g.token_ids for g in generate(other, PROMPTS, 12, ignore_eos=True)] == want
        cfg = local.cfg
        for seed, t in ((0, 1), (1, 45), (2, 300)):
            hidden, plan = random_batch(cfg, t, seed, local.spec.torch_dtype(), device="cuda:0")
            for layer in cfg.moe_layers:
                assert torch.equal(other.backend.expert_outputs(layer, hidden, plan),
                                   local.backend.expert_outputs(layer, hidden, plan)), (seed, layer)
    finally:
        other.close()
        local.close()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("ep", [2, 4])
def test_host_staged_ranks_sharing_one_gpu_equal_local(dtype: str, ep: int) -> None:
    _assert_equal_to_local(dtype, backend="host-staged", ep_size=ep)


@pytest.mark.skipif(GPUS < 2, reason="nccl runs one GPU per rank: needs 2 GPUs")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_nccl_one_gpu_per_rank_equals_local(dtype: str) -> None:
    _assert_equal_to_local(dtype, backend="nccl", ep_size=2)


def test_nccl_refuses_more_ranks_than_gpus() -> None:
    with pytest.raises(NcclRuntimeError, match=f"need {GPUS + 1} visible GPUs, found {GPUS}"):
        build_engine(_spec(backend="nccl", ep_size=GPUS + 1))


def test_killed_rank_on_gpu_fails_fast() -> None:
    engine = build_engine(_spec(backend="host-staged", ep_size=2, rank_timeout_s=3.0))
    try:
        generate(engine, PROMPTS, 2, ignore_eos=True)
        os.kill(engine.backend.group.procs[1].pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(RankFailure, match="expert rank 1 exited"):
            generate(engine, PROMPTS, 4, ignore_eos=True)
        assert time.monotonic() - t0 < 3.0
        with pytest.raises(RankFailure):
            generate(engine, PROMPTS, 1, ignore_eos=True)
    finally:
        engine.close()
