"""Triton kernels for the CUDA decode step. Selected at start-up (engine/engine.py logs which);
tested on CPU with TRITON_INTERPRET=1. This package imports no Triton itself, so CPU-only
installs can ask `triton_available()` first."""
from __future__ import annotations


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
