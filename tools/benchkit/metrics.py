"""Serving metrics exactly as `vllm bench serve` defines them (vllm/benchmarks/serve.py,
calculate_metrics), computed from per-request timelines, plus the across-repeats summary.

Per successful request: TTFT = first content chunk - send; E2EL = last content chunk - send;
TPOT = (E2EL - TTFT) / (output tokens - 1), only for requests with more than one output token;
ITL = every gap between successive content chunks (a chunk is any event with a `choices` entry).
Per run: output throughput = total output tokens of successful requests / benchmark duration;
request throughput = completed requests / duration. Failed requests (HTTP error, error chunk,
timeout, missing [DONE]) are counted, never averaged: they contribute nothing to any latency."""
from __future__ import annotations

import dataclasses
import math
import statistics

NOISY_SPREAD = 0.10  # (max - min) / median across repeats above this is "noisy"
LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "median", "std", "p90", "p99")
THROUGHPUTS = ("request_throughput", "output_throughput", "total_token_throughput")


@dataclasses.dataclass(slots=True)
class RequestRecord:
    index: int  # position in the level's workload
    ok: bool = False
    request_id: str | None = None  # X-Request-Id header, else the first chunk's id
    error: str | None = None
    timed_out: bool = False
    start: float = 0.0  # perf_counter seconds when the request was sent
    sent_s: float | None = None  # seconds from its level's start to its send (benchkit.workload.closed_loop)
    chunk_times: list[float] = dataclasses.field(default_factory=list)  # s after start, per content chunk
    output_tokens: int = 0  # usage.completion_tokens, else the number of content chunks
    prompt_tokens: int | None = None  # usage.prompt_tokens (the real count, not the words sent)
    usage_reported: bool = False

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def e2el(self) -> float | None:
        return self.chunk_times[-1] if self.chunk_times else None

    @property
    def tpot(self) -> float | None:
        if not self.chunk_times or self.output_tokens < 2:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:])]

    def to_dict(self) -> dict:
        """The request's own latencies for the report (ms; None where it has none, e.g. when it failed
        before its first chunk), its ITL gaps summarised, and how it ended."""
        def ms(seconds: float | None) -> float | None:
            return None if seconds is None else round(seconds * 1e3, 3)

        gaps = self.itls
        itl = {"count": len(gaps), "mean": ms(statistics.fmean(gaps)) if gaps else None,
               "median": ms(statistics.median(gaps)) if gaps else None,
               "p99": ms(percentile(gaps, 99)) if gaps else None, "max": ms(max(gaps)) if gaps else None}
        return {"index": self.index, "request_id": self.request_id, "ok": self.ok, "error": self.error,
                "timed_out": self.timed_out, "ttft_ms": ms(self.ttft), "tpot_ms": ms(self.tpot),
                "e2el_ms": ms(self.e2el), "itl_ms": itl, "output_tokens": self.output_tokens,
                "prompt_tokens": self.prompt_tokens, "chunks": len(self.chunk_times),
                "usage_reported": self.usage_reported, "sent_ms": ms(self.sent_s)}


def percentile(values: list[float], q: float) -> float:
    """numpy.percentile's default (linear interpolation between closest ranks)."""
    if not values:
        raise ValueError("percentile of no values")
    v = sorted(values)
    rank = q / 100 * (len(v) - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    return v[lo] + (v[hi] - v[lo]) * (rank - lo)


def describe(values: list[float]) -> dict[str, float | None]:
    """mean / median / std (population, as numpy) / p90 / p99, in the values' unit; None when empty."""
    if not values:
        return dict.fromkeys(STATS)
    return {"mean": statistics.fmean(values), "median": statistics.median(values), "std": statistics.pstdev(values),
            "p90": percentile(values, 90), "p99": percentile(values, 99)}


def summarise(records: list[RequestRecord], duration_s: float) -> dict:
    """One run's metrics, keyed as vLLM's result JSON (mean_ttft_ms, p99_itl_ms, output_throughput...)."""
    ok = [r for r in records if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    series = {
        "ttft": [r.ttft for r in ok],
        "tpot": [r.tpot for r in ok if r.tpot is not None],
        "itl": [gap for r in ok for gap in r.itls],
        "e2el": [r.e2el for r in ok],
    }
    m: dict = {
        "num_requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "timed_out": sum(1 for r in records if r.timed_out),
        "duration_s": duration_s,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration_s if duration_s > 0 else None,
        "output_throughput": out_tokens / duration_s if duration_s > 0 else None,
        "total_token_throughput": (in_tokens + out_tokens) / duration_s if duration_s > 0 else None,
        "usage_reported": all(r.usage_reported for r in ok) if ok else None,
    }
    for name, values in series.items():
        for stat, value in describe(values).items():
            m[f"{stat}_{name}_ms"] = None if value is None else value * 1e3
    return m


def metric_keys() -> list[str]:
    """The per-run numbers the across-repeats summary covers."""
    return [*THROUGHPUTS, *(f"{s}_{n}_ms" for n in LATENCIES for s in STATS if s != "std")]


def marker(values: list[float], any_failure: bool) -> str:
    """"failure" if any repeat had a failed request; else "noisy" when (max - min) / median exceeds
    NOISY_SPREAD; else "stable"."""
    if any_failure:
        return "failure"
    return "noisy" if spread(values) > NOISY_SPREAD else "stable"


def spread(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    lo, hi, mid = min(values), max(values), statistics.median(values)
    if hi == lo:
        return 0.0
    return math.inf if mid == 0 else (hi - lo) / abs(mid)


def across_repeats(runs: list[dict]) -> dict[str, dict]:
    """metric -> {median, min, max, spread, marker, n} over the runs of one level."""
    any_failure = any(r["failed"] for r in runs)
    out = {}
    for key in metric_keys():
        values = [r[key] for r in runs if r.get(key) is not None]
        if not values:
            out[key] = {"median": None, "min": None, "max": None, "spread": None, "n": 0,
                        "marker": "failure" if any_failure else "stable"}
            continue
        s = spread(values)
        out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values),
                    "spread": None if math.isinf(s) else s, "n": len(values), "marker": marker(values, any_failure)}
    return out


def worst_marker(markers: list[str]) -> str:
    for m in ("failure", "noisy"):
        if m in markers:
            return m
    return "stable"
