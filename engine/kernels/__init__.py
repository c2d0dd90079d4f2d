"""Triton kernels for the CUDA decode step. Selected at start-up (engine/engine.py logs which);
tested on CPU with TRITON_INTERPRET=1."""
