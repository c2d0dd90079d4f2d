"""Runtimes the EP backends cannot work on are refused at start-up, before any rank is spawned, with a
message that says what to change: nccl on a CPU device or without CUDA, with more ranks than GPUs or
two ranks on one GPU, an NCCL runtime older than the GPU architecture's floor, more ranks than routed
experts; and the test-only transport (nccl's code over gloo) outside the library API."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from pegainfer.engine.config import ModelConfig
from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.ep_setup import ep_spec, moe_shape
from pegainfer.engine.presets import PRESETS
from pegainfer.ep import registry
from pegainfer.ep.backends.nccl import NcclBackend, chunk_bytes_of
from pegainfer.ep.backends.nccl_over_gloo_test import NcclOverGlooTestBackend
from pegainfer.ep.nccl_runtime import (
    NCCL_FLOORS,
    NcclRuntimeError,
    check_distinct_gpus,
    check_nccl_runtime,
)
from pegainfer.ep.ownership import Ownership, OwnershipError
from pegainfer.ep.preflight import preflight
from pegainfer.ep.rendezvous import ReadyRecord
from pegainfer.ep.spec import EPSpec


@pytest.fixture
def fake_gpus(monkeypatch):
    """fake(count, capability, nccl_version): pretend this CPU build sees CUDA GPUs."""
    def fake(count: int, capability: tuple[int, int] = (9, 0), version: tuple = (2, 21, 5)) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: capability)
        monkeypatch.setattr(torch.cuda.nccl, "version", lambda: version)
        monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    return fake


def test_more_ranks_than_gpus_is_refused_before_anything_starts(fake_gpus) -> None:
    fake_gpus(2)
    cfg = ModelConfig.from_dict(PRESETS["tiny"], "preset tiny")
    spec = EngineSpec(random_preset="tiny", device="cuda:0", backend="nccl", ep_size=4)
    with pytest.raises(NcclRuntimeError, match=r"one GPU per rank: 4 rank\(s\) on this host starting at cuda:0 need 4 "
                                               r"visible GPUs, found 2\. Use --ep-size <= 2.*--backend host-staged"):
        NcclBackend.start(ep_spec(spec), moe_shape(cfg), Ownership(8, 4), shard=None)
    with pytest.raises(NcclRuntimeError, match=r"need 4 visible GPUs, found 2"):
        build_engine(spec)  # refused before any weight is loaded


def test_placement_counts_from_rank0s_gpu(fake_gpus) -> None:
    fake_gpus(4)
    check_nccl_runtime(torch.device("cuda:0"), 4)
    with pytest.raises(NcclRuntimeError, match="starting at cuda:2 need 5 visible GPUs, found 4"):
        check_nccl_runtime(torch.device("cuda:2"), 3)


def test_nccl_older_than_the_architecture_floor_is_refused(fake_gpus) -> None:
    assert NCCL_FLOORS[(12, 0)] == (2, 26, 2)
    fake_gpus(2, capability=(12, 0), version=(2, 21, 5))
    with pytest.raises(NcclRuntimeError, match=r"NCCL 2\.21\.5 is loaded, but cuda:0 \(sm_120\) needs NCCL >= 2\.26\.2\. "
                                               r"Point the loader at a newer libnccl\.so\.2.*LD_LIBRARY_PATH"):
        check_nccl_runtime(torch.device("cuda:0"), 2)
    fake_gpus(2, capability=(12, 0), version=(2, 26, 2))
    check_nccl_runtime(torch.device("cuda:0"), 2)  # at the floor: accepted
    fake_gpus(2, capability=(9, 0), version=(2, 18, 1))
    check_nccl_runtime(torch.device("cuda:0"), 2)  # Hopper has no floor in the table


def test_no_cuda_or_no_nccl_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NcclRuntimeError, match="CUDA is not available .*; use --backend host-staged --device cpu"):
        check_nccl_runtime(torch.device("cuda:0"), 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    with pytest.raises(NcclRuntimeError, match="no NCCL; use --backend host-staged"):
        check_nccl_runtime(torch.device("cuda:0"), 2)


@pytest.mark.parametrize("ranks", [1, 2, 64])
def test_nccl_on_a_cpu_device_is_refused_naming_host_staged(ranks: int) -> None:
    with pytest.raises(NcclRuntimeError, match=r"--backend nccl needs one CUDA GPU per rank, but --device cpu is "
                                               r"not a GPU; use --backend host-staged"):
        check_nccl_runtime(torch.device("cpu"), ranks)
    with pytest.raises(NcclRuntimeError, match="use --backend host-staged"):
        preflight("nccl", "cpu", ranks)
    with pytest.raises(NcclRuntimeError, match="use --backend host-staged"):
        build_engine(EngineSpec(random_preset="tiny", backend="nccl", ep_size=ranks))
    assert NcclBackend.pg_backend_for(torch.device("cuda:0")) == "nccl"


def test_the_test_only_transport_runs_nccls_code_over_gloo_on_cpu_only() -> None:
    e = registry.entry("nccl-over-gloo-test")
    assert e.maturity == "test-only" and e.load() is NcclOverGlooTestBackend
    assert issubclass(NcclOverGlooTestBackend, NcclBackend)  # the same code, another transport underneath
    assert NcclOverGlooTestBackend.pg_backend_for(torch.device("cpu")) == "gloo"
    preflight("nccl-over-gloo-test", "cpu", 64, allow_test_only=True)
    with pytest.raises(NcclRuntimeError, match="runs on CPU only"):
        preflight("nccl-over-gloo-test", "cuda:0", 2, allow_test_only=True)


@pytest.mark.parametrize("remote", [False, True])
def test_user_entry_points_refuse_the_test_only_transport(remote: bool) -> None:
    with pytest.raises(registry.TestOnlyBackend, match=r"--backend nccl-over-gloo-test is test-only .*; use "
                                                       r"--backend local or host-staged or nccl"):
        preflight("nccl-over-gloo-test", "cpu", 2, remote_ranks=remote)
    assert "nccl-over-gloo-test" not in registry.user_backends()
    with pytest.raises(registry.UnknownBackend, match=r"known: local, host-staged, nccl\)$"):
        preflight("mpi", "cpu", 2)


def _rec(rank: int, gpu: str, host: str = "h1") -> ReadyRecord:
    return ReadyRecord(rank, host, 100 + rank, f"cuda:{rank}", gpu, "0..1", 1, 0.1)


def test_two_ranks_on_one_gpu_are_refused() -> None:
    assert check_distinct_gpus([_rec(1, "GPU-b"), _rec(2, "GPU-c")], "GPU-a") is None
    reason = check_distinct_gpus([_rec(1, "GPU-b"), _rec(2, "GPU-a")], "GPU-a")
    assert reason is not None and "ranks 0 and 2 both run on GPU GPU-a" in reason
    assert "Duplicate GPU detected" in reason and "--backend host-staged" in reason
    assert "ranks 1 and 2" in check_distinct_gpus([_rec(1, "GPU-b"), _rec(2, "GPU-b", "h2")], "GPU-a")


def test_more_ranks_than_experts_is_refused_before_spawning() -> None:
    with pytest.raises(OwnershipError, match="ep size 9 is larger than the 8 routed experts"):
        build_engine(EngineSpec(random_preset="tiny", backend="host-staged", ep_size=9))


def test_chunk_size_comes_from_the_spec_then_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("PEGAINFER_EP_CHUNK_BYTES", raising=False)
    assert chunk_bytes_of(EPSpec()) == 64 << 20
    assert chunk_bytes_of(ep_spec(EngineSpec(ep_chunk_bytes=1000))) == 1000
    monkeypatch.setenv("PEGAINFER_EP_CHUNK_BYTES", "4096")
    assert chunk_bytes_of(EPSpec()) == 4096
    with pytest.raises(ValueError, match="positive"):
        monkeypatch.setenv("PEGAINFER_EP_CHUNK_BYTES", "0")
        chunk_bytes_of(EPSpec())


def test_the_test_only_transports_artifacts_say_so(caplog) -> None:
    """The engine, its start-up log and everything built from them (/v1/models, bench and correctness
    reports, trace records) name the test-only transport and its maturity, never `nccl`."""
    import json
    import logging

    from pegainfer.engine.generate import generate
    caplog.set_level(logging.INFO, logger="pegainfer")
    engine = build_engine(EngineSpec(random_preset="tiny", backend="nccl-over-gloo-test", ep_size=2))
    try:
        assert (engine.backend_name, engine.maturity) == ("nccl-over-gloo-test", "test-only")
        assert engine.backend.group.pg_backend == "gloo"
        assert len(generate(engine, [[5, 6, 7]], 2, ignore_eos=True)[0].token_ids) == 2
    finally:
        engine.close()
    events = {e["event"]: e for e in (json.loads(r.getMessage()) for r in caplog.records
                                      if r.getMessage().startswith("{"))}
    for name in ("weights_loaded", "engine_ready"):
        assert (events[name]["backend"], events[name]["maturity"]) == ("nccl-over-gloo-test", "test-only")
    assert events["expert_rank_joined"]["backend"] == "nccl-over-gloo-test"  # ep/'s own logger, same form
    assert not any('"nccl"' in r.getMessage() for r in caplog.records)
