"""Shared fixtures: tiny synthetic checkpoints written once per test session, one real daemon run
that the telemetry tests and the trace viewer's test read, and the mode the Triton kernels run in
(Triton's CPU interpreter where there is no CUDA device, compiled on one where there is), which must
be fixed before any kernel module is imported."""
from __future__ import annotations

import ctypes.util
import importlib
import json
import os
import pkgutil
from collections.abc import Callable
from pathlib import Path

import pytest


def _cuda_device() -> bool:
    """Whether Triton can compile for a CUDA device here: without the CUDA driver there is none (a
    cheap check, so torch-free runs stay fast); with it, torch says whether a device is usable."""
    if ctypes.util.find_library("cuda") is None and not os.path.exists("/dev/nvidiactl"):
        return False
    import torch
    return torch.cuda.is_available()


def pytest_configure(config: pytest.Config) -> None:
    """Triton reads TRITON_INTERPRET when a kernel is defined (`@triton.jit` at import), so it is set
    here, before any test module is collected, for the whole session: without a CUDA device every
    kernel runs in the interpreter (tests/engine/kernels/), and no CPU path of the engine launches
    one. A value set in the environment is kept."""
    if "TRITON_INTERPRET" not in os.environ and not _cuda_device():
        os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Kernels in the interpreter compute on numpy arrays, masked lanes included (a softmax over
    padding makes NaN the kernel never stores): numpy's RuntimeWarnings from inside the interpreter
    are no failures of the tests that run kernels there."""
    for item in items:
        if "triton_interpreter" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter"))


def _kernel_modes() -> set[str]:
    """"interpreted" and/or "compiled": how the kernels of every engine/kernels module were defined."""
    triton = pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")
    from triton.runtime.interpreter import InterpretedFunction

    from pegainfer.engine import kernels
    modes = set()
    for info in pkgutil.iter_modules(kernels.__path__):
        for value in vars(importlib.import_module(f"pegainfer.engine.kernels.{info.name}")).values():
            if isinstance(value, InterpretedFunction):
                modes.add("interpreted")
            elif isinstance(value, triton.runtime.JITFunction):
                modes.add("compiled")
    return modes


@pytest.fixture(scope="session")
def triton_interpreter() -> None:
    """For tests that run Triton kernels on CPU tensors: skipped unless every kernel runs in the
    interpreter (on a CUDA machine they are compiled; their GPU tests run there instead)."""
    modes = _kernel_modes()
    if modes != {"interpreted"}:
        pytest.skip(f"the Triton kernels are {'/'.join(sorted(modes))} here, not interpreted: TRITON_INTERPRET=1 "
                    f"must be set before engine.kernels is imported (tests/conftest.py does so without a CUDA device)")


@pytest.fixture(scope="session")
def triton_gpu():
    """For the GPU variants of the kernel tests: a CUDA device with the kernels compiled for it."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if _kernel_modes() != {"compiled"}:
        pytest.skip("the Triton kernels run in the interpreter here (TRITON_INTERPRET=1)")
    return torch.device("cuda")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny preset, seed 0 (the same bytes as the embedded default model)."""
    from pegainfer.engine.checkpoint_writer import write_checkpoint  # imported here: torch-free tests stay fast

    return write_checkpoint(tmp_path_factory.mktemp("tiny") / "tiny-seed0", "tiny", 0)


@pytest.fixture(scope="session")
def tiny_variant_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """make(overrides, seed=0) -> folder of the tiny preset with config overrides; cached per session."""
    from pegainfer.engine.checkpoint_writer import write_checkpoint

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
