"""Rank start-up: rank 0 waits for every expert rank with a deadline and names the missing or failed
ones; expert ranks started on their own (`pegainfer expert-worker` -> run_expert_worker) join rank 0's
store, load only their experts, serve exactly, and exit 0 on rank 0's stop message."""
from __future__ import annotations

import dataclasses
import sys
import time

import pytest
import torch
import torch.multiprocessing as mp

from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.ep_setup import load_rank_experts
from pegainfer.engine.generate import generate
from pegainfer.ep.backend import RankFailure
from pegainfer.ep.rendezvous import (
    ReadyRecord,
    free_port,
    host_store,
    post_failed,
    post_ready,
    wait_for_ranks,
)
from pegainfer.ep.worker import end_process, run_expert_worker
from tests.ep.conftest import PROMPTS


@dataclasses.dataclass(frozen=True, slots=True)
class MultiHostSpec(EngineSpec):
    """EngineSpec plus the optional multi-host fields the EP backends read."""
    ep_master_addr: str | None = None
    ep_master_port: int | None = None
    rank_join_timeout_s: float | None = None


def _record(rank: int) -> ReadyRecord:
    return ReadyRecord(rank, "host", 1, "cpu", "", "0..1", 10, 0.1)


def test_wait_names_the_ranks_that_never_joined() -> None:
    store = host_store("127.0.0.1", free_port(), 4, 5.0)
    post_ready(store, _record(2))
    t0 = time.monotonic()
    with pytest.raises(RankFailure, match=r"expert rank\(s\) 1, 3 did not join within 0.3 s; ready: \[2\]"):
        wait_for_ranks(store, [1, 2, 3], 0.3)
    assert time.monotonic() - t0 < 2.0


def test_wait_returns_every_record() -> None:
    store = host_store("127.0.0.1", free_port(), 3, 5.0)
    post_ready(store, _record(1))
    post_ready(store, _record(2))
    assert wait_for_ranks(store, [1, 2], 1.0) == {1: _record(1), 2: _record(2)}


def test_wait_names_a_rank_that_failed_or_exited() -> None:
    store = host_store("127.0.0.1", free_port(), 3, 5.0)
    post_failed(store, 2, "WeightsError: shard missing")
    with pytest.raises(RankFailure, match="expert rank 2 failed to start: WeightsError: shard missing"):
        wait_for_ranks(store, [1, 2], 5.0)
    with pytest.raises(RankFailure, match="expert rank 1 exited with code 3 before it was ready"):
        wait_for_ranks(store, [1], 5.0, exitcode=lambda r: 3)


def test_rank0_names_missing_remote_ranks_and_how_to_start_them() -> None:
    port = free_port()
    spec = MultiHostSpec(random_preset="tiny", backend="host-staged", ep_size=3, ep_master_addr="127.0.0.1",
                         ep_master_port=port, rank_join_timeout_s=0.5)
    with pytest.raises(RankFailure, match=rf"expert rank\(s\) 1, 2 did not join within 0.5 s \(start them with: "
                                          rf"pegainfer expert-worker --rank R --world-size 3 --master-addr 127.0.0.1 "
                                          rf"--master-port {port} --backend host-staged\)"):
        build_engine(spec)


def _worker_main(kwargs: dict) -> None:
    end_process(run_expert_worker(loader=load_rank_experts, **kwargs))  # as `pegainfer expert-worker` does


def _start_worker(**kwargs):
    p = mp.get_context("spawn").Process(target=_worker_main, args=(kwargs,), daemon=True)
    p.start()
    return p


@pytest.mark.parametrize("backend", ["host-staged", "nccl-over-gloo-test"])
def test_expert_worker_started_on_its_own_serves_exactly(backend: str, tiny_model_dir) -> None:
    port = free_port()
    worker = _start_worker(rank=1, world_size=2, master_addr="127.0.0.1", master_port=port,
                           model_dir=str(tiny_model_dir), backend=backend, device="cpu", num_threads=1)
    local = build_engine(EngineSpec(model_dir=str(tiny_model_dir)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the worker runs one GEMM thread: rank 0 must too for equal bits
    try:
        engine = build_engine(MultiHostSpec(model_dir=str(tiny_model_dir), backend=backend, ep_size=2,
                                            ep_master_addr="127.0.0.1", ep_master_port=port, rank_join_timeout_s=60))
        try:
            want = generate(local, PROMPTS, 6, ignore_eos=True)
            got = generate(engine, PROMPTS, 6, ignore_eos=True)
            assert [g.token_ids for g in got] == [w.token_ids for w in want]
        finally:
            engine.close()
    finally:
        torch.set_num_threads(threads)
    worker.join(10)
    assert worker.exitcode == 0  # a clean stop, not a lost rank 0


def test_expert_worker_start_failure_is_reported_by_rank0() -> None:
    port = free_port()
    worker = _start_worker(rank=1, world_size=2, master_addr="127.0.0.1", master_port=port,
                           model_dir="/nonexistent/model", backend="host-staged")
    with pytest.raises(RankFailure, match=r"expert rank 1 failed to start: .*nonexistent"):
        build_engine(MultiHostSpec(random_preset="tiny", backend="host-staged", ep_size=2,
                                   ep_master_addr="127.0.0.1", ep_master_port=port, rank_join_timeout_s=60))
    worker.join(10)
    assert worker.exitcode == 1


def _rank0_main(port: int, ready) -> None:
    engine = build_engine(MultiHostSpec(random_preset="tiny", backend="host-staged", ep_size=2,
                                        ep_master_addr="127.0.0.1", ep_master_port=port, rank_join_timeout_s=60))
    generate(engine, PROMPTS, 2, ignore_eos=True)
    ready.set()
    time.sleep(60)


def test_expert_worker_exits_when_rank0_dies() -> None:
    port = free_port()
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    rank0 = ctx.Process(target=_rank0_main, args=(port, ready), daemon=True)
    rank0.start()
    worker = _start_worker(rank=1, world_size=2, master_addr="127.0.0.1", master_port=port,
                           random_preset="tiny", backend="host-staged")
    try:
        assert ready.wait(60)
        rank0.kill()
        worker.join(10)
        assert worker.exitcode == 1  # lost rank 0: it says so and ends, it does not wait forever
    finally:
        rank0.kill()
        worker.kill()


def test_surviving_expert_worker_exits_after_rank0_gives_up() -> None:
    """Rank 1 dies; rank 0 fails the group and closes it; rank 2 (started on its own, so rank 0
    cannot terminate it) notices and exits."""
    port = free_port()
    workers = {r: _start_worker(rank=r, world_size=3, master_addr="127.0.0.1", master_port=port,
                                random_preset="tiny", backend="nccl-over-gloo-test") for r in (1, 2)}
    engine = build_engine(MultiHostSpec(random_preset="tiny", backend="nccl-over-gloo-test", ep_size=3,
                                        rank_timeout_s=3.0, ep_master_addr="127.0.0.1", ep_master_port=port,
                                        rank_join_timeout_s=60))
    try:
        generate(engine, PROMPTS, 2, ignore_eos=True)
        workers[1].kill()
        with pytest.raises(RankFailure):
            generate(engine, PROMPTS, 4, ignore_eos=True)
        engine.close()
        workers[2].join(10)
        assert workers[2].exitcode == 1
    finally:
        engine.close()
        for w in workers.values():
            w.kill()


def test_the_cli_expert_worker_loads_through_the_engines_loader(tiny_model_dir) -> None:
    """`pegainfer expert-worker` wires the engine's loader into ep's worker: the rank joins, reports
    ready on ep/'s logger in the engine's JSON form, serves exactly, and exits 0 on the stop message."""
    import json
    import subprocess
    from pathlib import Path

    port = free_port()
    worker = subprocess.Popen([sys.executable, "-m", "pegainfer.daemon.cli", "expert-worker", "--rank", "1", "--world-size", "2",
                               "--master-addr", "127.0.0.1", "--master-port", str(port), "--model",
                               str(tiny_model_dir), "--backend", "host-staged", "--num-threads", "1"],
                              cwd=Path(__file__).resolve().parents[2], stderr=subprocess.PIPE, text=True)
    local = build_engine(EngineSpec(model_dir=str(tiny_model_dir)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engine = build_engine(MultiHostSpec(model_dir=str(tiny_model_dir), backend="host-staged", ep_size=2,
                                            ep_master_addr="127.0.0.1", ep_master_port=port, rank_join_timeout_s=60))
        try:
            got = generate(engine, PROMPTS, 4, ignore_eos=True)
            assert [g.token_ids for g in got] == [w.token_ids for w in generate(local, PROMPTS, 4, ignore_eos=True)]
        finally:
            engine.close()
        _, err = worker.communicate(timeout=30)
    finally:
        torch.set_num_threads(threads)
        worker.kill()
    assert worker.returncode == 0, err
    events = {e["event"]: e for e in (json.loads(line) for line in err.splitlines() if line.startswith("{"))}
    assert events["expert_rank_ready"]["rank"] == 1 and events["expert_rank_ready"]["experts"] == "4..7"
    assert "expert_rank_stopped" in events
