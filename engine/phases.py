"""Named phases of a forward step, marked with torch.profiler.record_function so a profiler run
(tools/bench_direct.py --attribution) can split a decode step into attention, routing, dispatch,
experts, combine, LM head and sampling, on CPU and GPU. Outside a profiler run the marks cost a
few microseconds each and nothing else."""
from __future__ import annotations

from torch.profiler import record_function

PHASES = ("attention", "routing", "dispatch", "experts", "combine", "shared_experts", "dense_mlp", "lm_head",
          "sampling")


def phase(name: str) -> record_function:
    return record_function(f"pegainfer::{name}")
