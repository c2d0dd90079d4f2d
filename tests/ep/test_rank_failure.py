"""The reliability gate: an expert rank that dies or stalls mid-generation makes rank 0 raise a
RankFailure naming it within the rank timeout; the backend then stays failed (every later call
raises at once) and close() still returns promptly."""
from __future__ import annotations

import os
import signal
import time

import pytest

from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.generate import generate
from pegainfer.ep.backend import RankFailure
from tests.ep.conftest import PROMPTS

TIMEOUT_S = 3.0


def _sabotage_at(engine, call: int, action) -> None:
    """Run `action()` just before the backend's `call`-th expert exchange (mid-generation)."""
    backend = engine.backend
    real = backend.expert_outputs
    seen = {"n": 0}

    def wrapped(layer, hidden, plan):
        seen["n"] += 1
        if seen["n"] == call:
            action()
        return real(layer, hidden, plan)

    backend.expert_outputs = wrapped


def _assert_failed_for_good(engine, match: str) -> None:
    """After the failure every exchange raises at once, and close() returns promptly."""
    backend = engine.backend
    t0 = time.monotonic()
    with pytest.raises(RankFailure, match=match):
        generate(engine, [PROMPTS[0]], 2, ignore_eos=True)
    assert time.monotonic() - t0 < 0.5
    t0 = time.monotonic()
    engine.close()
    engine.close()  # idempotent
    assert time.monotonic() - t0 < 4.0
    assert all(p.exitcode is not None for p in backend.group.procs.values())


@pytest.mark.parametrize("backend, ep, victim", [("host-staged", 2, 1), ("nccl-over-gloo-test", 3, 2)])
def test_killed_rank_fails_fast_and_stays_failed(backend: str, ep: int, victim: int) -> None:
    engine = build_engine(EngineSpec(random_preset="tiny", backend=backend, ep_size=ep, rank_timeout_s=TIMEOUT_S))
    try:
        pid = engine.backend.group.procs[victim].pid
        killed_at = {}

        def kill() -> None:
            os.kill(pid, signal.SIGKILL)
            killed_at["t"] = time.monotonic()

        _sabotage_at(engine, 5, kill)
        with pytest.raises(RankFailure, match=rf"expert rank {victim} exited \(killed by SIGKILL\) during layer \d+ exchange"):
            generate(engine, PROMPTS, 8, ignore_eos=True)
        assert time.monotonic() - killed_at["t"] < TIMEOUT_S
        _assert_failed_for_good(engine, f"rank {victim}")
    finally:
        engine.close()


def test_stalled_host_staged_rank_fails_within_the_timeout() -> None:
    engine = build_engine(EngineSpec(random_preset="tiny", backend="host-staged", ep_size=2, rank_timeout_s=TIMEOUT_S))
    pid = engine.backend.group.procs[1].pid
    stopped_at = {}

    def stop() -> None:
        os.kill(pid, signal.SIGSTOP)  # alive but silent: only the timeout can notice
        stopped_at["t"] = time.monotonic()

    try:
        _sabotage_at(engine, 4, stop)
        with pytest.raises(RankFailure, match=r"expert rank\(s\) 1 did not complete layer \d+ exchange within 3 s"):
            generate(engine, PROMPTS, 8, ignore_eos=True)
        # the rank timeout plus a small slack (it was 1 s more: a wait for an exit status no stopped rank gives)
        assert time.monotonic() - stopped_at["t"] <= TIMEOUT_S + 0.5
        _assert_failed_for_good(engine, "rank\\(s\\) 1")
    finally:
        if engine.backend.group.procs[1].exitcode is None:
            os.kill(pid, signal.SIGCONT)
        engine.close()
