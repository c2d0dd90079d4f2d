"""Shared pieces of the benchmarks (tools/bench_direct.py, tools/bench_serving.py): metric
definitions, workloads, the streaming client, trace joins, reports, plots and the HF side."""
