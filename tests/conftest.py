"""Shared fixtures: tiny synthetic checkpoints written once per test session, and one real daemon run
that the telemetry tests and the trace viewer's test read."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny preset, seed 0 (the same bytes as the embedded default model)."""
    from engine.checkpoint_writer import write_checkpoint  # imported here: torch-free tests stay fast

    return write_checkpoint(tmp_path_factory.mktemp("tiny") / "tiny-seed0", "tiny", 0)


@pytest.fixture(scope="session")
def tiny_variant_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """make(overrides, seed=0) -> folder of the tiny preset with config overrides; cached per session."""
    from engine.checkpoint_writer import write_checkpoint

    made: dict[str, Path] = {}

    def make(overrides: dict, seed: int = 0) -> Path:
        key = f"{seed}:{json.dumps(overrides, sort_keys=True)}"
        if key not in made:
            made[key] = write_checkpoint(tmp_path_factory.mktemp("tiny-variant") / "model", "tiny", seed, overrides)
        return made[key]

    return make


@pytest.fixture(scope="session")
def daemon_run(tmp_path_factory: pytest.TempPathFactory):
    """One real daemon run per session (tests/telemetry/run.py), shared by the telemetry tests and
    the trace viewer's (tests/tools/test_trace_view.py)."""
    from tests.telemetry.run import run_daemon

    return run_daemon(tmp_path_factory.mktemp("telemetry-daemon"))
