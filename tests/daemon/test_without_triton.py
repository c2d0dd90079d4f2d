"""A CPU install has no Triton: `make serve` installs the run-time dependencies only, and the CPU
torch wheel brings none. The CLI, the daemon and its expert ranks must import and serve without it.
Each process here finds a `triton` package first on PYTHONPATH that refuses to import (as a missing
one does), and spawned expert ranks inherit the path."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.daemon_process import ROOT, DaemonProcess

PROMPT = "class Parser:"


@pytest.fixture(scope="module")
def no_triton_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    shadow = tmp_path_factory.mktemp("no-triton")
    (shadow / "triton").mkdir()
    (shadow / "triton" / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'triton\'", '
                                                   'name="triton")\n')
    path = os.pathsep.join(p for p in (str(shadow), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


def _generate(env: dict[str, str] | None, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pegainfer.daemon.cli", "generate", "--prompt", PROMPT, "--max-tokens", "8", *extra]
    return subprocess.run(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=300)


def test_the_shadow_really_hides_triton(no_triton_env: dict[str, str]) -> None:
    code = "from pegainfer.engine.kernels import triton_available; print(triton_available())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **no_triton_env},
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_generate_without_triton_gives_the_same_text(no_triton_env: dict[str, str]) -> None:
    without = _generate(no_triton_env)
    assert without.returncode == 0, without.stderr[-2000:]
    assert "Traceback" not in without.stderr
    assert without.stdout == _generate(None).stdout


def test_serve_without_triton_with_expert_ranks(no_triton_env: dict[str, str], tmp_path: Path) -> None:
    """The daemon and two host-staged expert ranks, none with Triton: greedy and sampled streams end
    normally and the log holds no traceback."""
    with DaemonProcess("--backend", "host-staged", "--ep-size", "2", env=no_triton_env,
                       log_path=tmp_path / "daemon.log") as daemon:
        for body in ({"prompt": PROMPT, "max_tokens": 8},
                     {"prompt": PROMPT, "max_tokens": 8, "temperature": 0.8, "top_p": 0.9, "seed": 1,
                      "presence_penalty": 0.5, "logprobs": 2}):
            with httpx.stream("POST", daemon.url + "/v1/completions", json=body | {"stream": True},
                              timeout=120) as r:
                assert r.status_code == 200
                lines = [line for line in r.iter_lines() if line.startswith("data: ")]
            assert lines[-1] == "data: [DONE]"
            assert '"finish_reason":"length"' in lines[-2].replace(" ", "")
    assert "Traceback" not in daemon.log()
