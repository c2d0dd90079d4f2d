"""Kernel and host-path experiments, kept runnable because docs/perf-notes.md cites them as the
commands behind its records: gpu_probe (decode-step timings, A/B switches, timelines), kernel_bench
and gemv_bench (expert, MLA and split-K kernels against their alternatives), bench_host_path and
bench_host_micro (the daemon's host-side cost per token and per step), and h200_gate.sh (the GPU
tests and the reliability gate in one device call). Not user-facing: users run the tools one level up."""
