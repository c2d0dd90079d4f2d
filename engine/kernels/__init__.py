"""Triton kernels for the CUDA decode step, one file per kernel, each a function of tensors and the
frozen KernelConfig (config.py) the engine resolves at start-up (engine/engine.py logs which run);
tested on CPU in Triton's interpreter (tests/engine/kernels/, one test file per kernel). This package
(and config.py) imports no Triton itself, so CPU-only installs can ask `triton_available()` first."""
from __future__ import annotations


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
