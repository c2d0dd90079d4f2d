"""Histogram bucket bounds. Where vLLM exports a family of the same meaning, every one of vLLM's
bounds is here (copied from vllm/v1/metrics/loggers.py), so that a dashboard or alert written
against a vLLM bound (`le="0.1"`) selects the same thing; pegainfer adds finer bounds below vLLM's
smallest ones, because its decode step takes about 2 ms on an H200 and vLLM's smallest
inter-token bound is 10 ms. docs/metrics.md lists the families that use each."""
from __future__ import annotations

# vLLM's own lists
VLLM_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
             80.0, 160.0, 640.0, 2560.0)
VLLM_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
VLLM_REQUEST_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                        240.0, 480.0, 960.0, 1920.0, 7680.0)
VLLM_ITERATION_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
VLLM_PARAMS_N = (1, 2, 5, 10, 20)

# pegainfer's finer bounds below them
FINE_ITL = (0.001, 0.0015, 0.002, 0.0025, 0.003, 0.004, 0.005, 0.0075)
FINE_REQUEST_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2)

TTFT = VLLM_TTFT
ITL = tuple(sorted({*VLLM_ITL, *FINE_ITL}))
REQUEST_LATENCY = tuple(sorted({*VLLM_REQUEST_LATENCY, *FINE_REQUEST_LATENCY}))
STEP = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.0, 10.0)


def one_two_five(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's build_1_2_5_buckets, for token counts)."""
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(out)
            out.append(m * scale)
        scale *= 10
