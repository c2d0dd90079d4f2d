"""Expert-rank liveness while the group is idle (ep/heartbeat.py): a rank whose process ends is
noticed within a second (spawned by rank 0 or started on its own), a rank that is alive but silent
(SIGSTOP) is failed within the rank timeout of its last beat, a request that comes in between does
not wait a second rank timeout, and an idle group whose ranks beat stays healthy past the timeout."""
from __future__ import annotations

import os
import signal
import time

import pytest

from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.generate import generate
from pegainfer.ep.backend import RankFailure
from pegainfer.ep.heartbeat import HEARTBEAT_S
from pegainfer.ep.rendezvous import free_port
from tests.ep.conftest import PROMPTS
from tests.ep.test_rendezvous import MultiHostSpec, _start_worker

TIMEOUT_S = 2.0
SLACK_S = 0.5  # the documented bound: a silent rank is failed within the rank timeout plus this


def _time_to_failure(engine, limit_s: float) -> tuple[float, str]:
    """Poll the idle check (as the GPU thread does, but every 10 ms) until it raises; seconds and message."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        try:
            engine.backend.check_ranks()
        except RankFailure as e:
            return time.monotonic() - t0, str(e)
        time.sleep(0.01)
    raise AssertionError(f"no RankFailure within {limit_s:g} s")


def _resume_and_kill(pid: int) -> None:
    """Never leave a stopped process behind."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return


@pytest.mark.parametrize("backend, ep, victim", [("host-staged", 2, 1), ("nccl-over-gloo-test", 3, 2)])
def test_idle_killed_rank_is_noticed_within_a_second(backend: str, ep: int, victim: int) -> None:
    engine = build_engine(EngineSpec(random_preset="tiny", backend=backend, ep_size=ep, rank_timeout_s=TIMEOUT_S))
    try:
        generate(engine, PROMPTS[:2], 2, ignore_eos=True)
        time.sleep(TIMEOUT_S + 0.5)  # idle past the rank timeout: beating ranks are not silent ones
        engine.backend.check_ranks()
        os.kill(engine.backend.group.procs[victim].pid, signal.SIGKILL)
        took, message = _time_to_failure(engine, 5.0)
        assert took < 1.0, message
        assert message == f"expert rank {victim} exited (killed by SIGKILL) while idle"
        t0 = time.monotonic()
        with pytest.raises(RankFailure, match=f"expert rank {victim} exited"):  # the group stays failed
            generate(engine, [PROMPTS[0]], 2, ignore_eos=True)
        assert time.monotonic() - t0 < 0.5
    finally:
        engine.close()
    assert all(p.exitcode is not None for p in engine.backend.group.procs.values())


def test_idle_stalled_rank_is_failed_within_the_rank_timeout() -> None:
    engine = build_engine(EngineSpec(random_preset="tiny", backend="host-staged", ep_size=2, rank_timeout_s=TIMEOUT_S))
    pid = engine.backend.group.procs[1].pid
    try:
        generate(engine, PROMPTS[:2], 2, ignore_eos=True)
        os.kill(pid, signal.SIGSTOP)  # alive but silent: only its missing beats can tell
        took, message = _time_to_failure(engine, TIMEOUT_S + 5.0)
        # silence counts from the last beat, at most one beat period before the stop
        assert TIMEOUT_S - HEARTBEAT_S - 0.05 <= took <= TIMEOUT_S + SLACK_S, message
        assert message.startswith("expert rank 1 sent no heartbeat for ")
        assert message.endswith(" s (stopped or hung) while idle")
    finally:
        _resume_and_kill(pid)
        engine.close()


def test_request_after_an_idle_stall_fails_one_rank_timeout_after_the_stall() -> None:
    """The rank stopped before the request came: the request's first wait gets only what is left of
    the rank timeout, not a whole one more."""
    engine = build_engine(EngineSpec(random_preset="tiny", backend="host-staged", ep_size=2, rank_timeout_s=TIMEOUT_S))
    pid = engine.backend.group.procs[1].pid
    try:
        generate(engine, PROMPTS[:2], 2, ignore_eos=True)
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        time.sleep(TIMEOUT_S / 2)
        with pytest.raises(RankFailure, match=r"expert rank 1 sent no heartbeat for \d+\.\d s \(stopped or hung\) "
                                              r"during layer \d+ exchange"):
            generate(engine, PROMPTS, 4, ignore_eos=True)
        assert time.monotonic() - t0 <= TIMEOUT_S + SLACK_S
    finally:
        _resume_and_kill(pid)
        engine.close()


def test_death_of_a_rank_started_on_its_own_is_noticed_within_a_second() -> None:
    """A `pegainfer expert-worker` rank on another host has no process rank 0 can watch: its closed
    connection says it is gone."""
    port = free_port()
    worker = _start_worker(rank=1, world_size=2, master_addr="127.0.0.1", master_port=port,
                           random_preset="tiny", backend="host-staged")
    try:
        engine = build_engine(MultiHostSpec(random_preset="tiny", backend="host-staged", ep_size=2,
                                            rank_timeout_s=TIMEOUT_S, ep_master_addr="127.0.0.1",
                                            ep_master_port=port, rank_join_timeout_s=60))
        try:
            generate(engine, PROMPTS[:2], 2, ignore_eos=True)
            engine.backend.check_ranks()
            worker.kill()
            took, message = _time_to_failure(engine, 5.0)
            assert took < 1.0, message
            assert message == ("expert rank 1 closed its connection (its process ended or its host is unreachable) "
                               "while idle")
        finally:
            engine.close()
    finally:
        worker.kill()


def test_local_backend_has_no_ranks_to_check() -> None:
    engine = build_engine(EngineSpec(random_preset="tiny"))
    try:
        assert engine.backend.check_ranks() is None
    finally:
        engine.close()
