"""Phase attribution of decode steps: a torch.profiler run over a few decode steps, summing CPU
and device time per `pegainfer::<phase>` mark (engine/phases.py). A mark's CPU time is its wall time
on the host (inclusive); its device time is the time of every kernel launched inside it."""
from __future__ import annotations

import time
from collections.abc import Callable

from pegainfer.engine.phases import PHASES

PREFIX = "pegainfer::"


def _device_total(e) -> float:
    v = getattr(e, "device_time_total", None)
    return float(v if v is not None else getattr(e, "cuda_time_total", 0.0))


def _self_device_total(e) -> float:
    v = getattr(e, "self_device_time_total", None)
    return float(v if v is not None else getattr(e, "self_cuda_time_total", 0.0))


def profile_steps(step: Callable[[], object], steps: int, on_gpu: bool) -> dict:
    """Calls step() (one decode step) steps + 1 times: once under a throwaway profiler (its first
    start is slow), then `steps` times measured. Times in ms per decode step."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities):
        step()
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        wall = time.perf_counter() - t0
    per: dict[str, dict[str, float]] = {}
    device_total_us = 0.0
    for e in prof.events():
        if e.device_type != DeviceType.CPU:
            continue  # the device-side copies of the marks; their kernels count on the host event
        device_total_us += _self_device_total(e)
        if not e.name.startswith(PREFIX):
            continue
        p = per.setdefault(e.name[len(PREFIX):], {"calls": 0, "cpu_us": 0.0, "device_us": 0.0})
        p["calls"] += 1
        p["cpu_us"] += e.cpu_time_total
        p["device_us"] += _device_total(e)
    order = [n for n in PHASES if n in per] + sorted(n for n in per if n not in PHASES)
    n = max(steps, 1)
    phases = {name: {"calls_per_step": per[name]["calls"] / n,
                     "cpu_ms_per_step": per[name]["cpu_us"] / 1e3 / n,
                     "device_ms_per_step": per[name]["device_us"] / 1e3 / n if on_gpu else None}
              for name in order}
    cpu_marked = sum(p["cpu_ms_per_step"] for p in phases.values())
    wall_ms = wall * 1e3 / n
    return {
        "steps": steps,
        "wall_ms_per_step": wall_ms,
        "device_ms_per_step": device_total_us / 1e3 / n if on_gpu else None,
        "cpu_ms_unmarked_per_step": max(wall_ms - cpu_marked, 0.0),
        "phases": phases,
        "phases_absent": [name for name in PHASES if name not in per],
        "note": "times include profiler overhead; compare phases with each other, not with the timed TPOT",
    }
