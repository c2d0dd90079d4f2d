"""vllm bench serve's metric definitions on hand-built timelines, percentiles against numpy, and
the across-repeats marker (stable / noisy / failure)."""
from __future__ import annotations

import random

import pytest

from tools.benchkit.metrics import RequestRecord, across_repeats, marker, percentile, summarise, worst_marker


def rec(index: int, times: list[float], out: int, prompt: int | None = 10, ok: bool = True, **kw) -> RequestRecord:
    return RequestRecord(index=index, ok=ok, chunk_times=times, output_tokens=out, prompt_tokens=prompt,
                         usage_reported=True, **kw)


def timeline() -> list[RequestRecord]:
    return [
        rec(0, [0.1, 0.15, 0.25, 0.3], 4, 10),  # TTFT 100, E2EL 300, TPOT 200/3, ITL 50 100 50
        rec(1, [0.2, 0.4], 2, 20),  # TTFT 200, E2EL 400, TPOT 200, ITL 200
        rec(2, [0.5], 1, 0),  # one token: TTFT 500, E2EL 500, no TPOT, no ITL
        rec(3, [0.01, 9.0], 50, 99, ok=False, error="error chunk: boom"),  # failed: in no average
        rec(4, [], 0, None, ok=False, error="timed out", timed_out=True),
    ]


def test_latencies_follow_vllm_definitions():
    m = summarise(timeline(), duration_s=2.0)
    assert (m["num_requests"], m["completed"], m["failed"], m["timed_out"]) == (5, 3, 2, 1)
    assert m["total_output_tokens"] == 7 and m["total_input_tokens"] == 30
    assert m["output_throughput"] == pytest.approx(3.5)
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["total_token_throughput"] == pytest.approx(18.5)
    assert m["mean_ttft_ms"] == pytest.approx(800 / 3)
    assert m["median_ttft_ms"] == pytest.approx(200)
    assert m["p90_ttft_ms"] == pytest.approx(440)  # rank 1.8 between 200 and 500
    assert m["p99_ttft_ms"] == pytest.approx(494)
    assert m["std_ttft_ms"] == pytest.approx(((100 - 800 / 3) ** 2 + (200 - 800 / 3) ** 2 + (500 - 800 / 3) ** 2) ** .5
                                              / 3 ** .5)
    assert m["mean_tpot_ms"] == pytest.approx((200 / 3 + 200) / 2)
    assert m["p90_tpot_ms"] == pytest.approx(200 / 3 + 0.9 * (200 - 200 / 3))
    assert m["mean_itl_ms"] == pytest.approx(100)  # gaps 50, 100, 50, 200
    assert m["median_itl_ms"] == pytest.approx(75)
    assert m["p99_itl_ms"] == pytest.approx(197)
    assert m["mean_e2el_ms"] == pytest.approx(400) and m["p99_e2el_ms"] == pytest.approx(498)


def test_failures_never_reach_the_averages():
    clean = summarise(timeline()[:3], 2.0)
    with_failures = summarise(timeline(), 2.0)
    for key in clean:
        if key.endswith("_ms") or key in ("total_output_tokens", "output_throughput"):
            assert with_failures[key] == pytest.approx(clean[key]), key


def test_all_failed_has_no_latencies():
    m = summarise([rec(0, [0.1, 0.2], 2, ok=False, error="HTTP 500")], 1.0)
    assert m["completed"] == 0 and m["failed"] == 1 and m["output_throughput"] == 0
    assert m["mean_ttft_ms"] is None and m["p99_e2el_ms"] is None and m["mean_tpot_ms"] is None


def test_tpot_uses_usage_tokens_not_chunks():
    """A chunk may carry several tokens (held-back UTF-8): TPOT divides by output tokens - 1."""
    r = rec(0, [0.1, 0.5], 5)
    assert r.tpot == pytest.approx(0.1)
    assert r.itls == [pytest.approx(0.4)]


def test_percentile_matches_numpy():
    np = pytest.importorskip("numpy")
    rng = random.Random(7)
    for n in (1, 2, 3, 10, 101):
        values = [rng.expovariate(1.0) for _ in range(n)]
        for q in (0, 50, 90, 99, 100):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    with pytest.raises(ValueError):
        percentile([], 50)


def run(throughput: float, failed: int = 0) -> dict:
    m = summarise([rec(0, [0.1, 0.2], 2)], 1.0)
    m["output_throughput"], m["failed"] = throughput, failed
    return m


def test_marker_stable_noisy_failure():
    stable = across_repeats([run(100), run(105), run(98)])["output_throughput"]
    assert stable["marker"] == "stable"
    assert (stable["median"], stable["min"], stable["max"], stable["n"]) == (100, 98, 105, 3)
    assert stable["spread"] == pytest.approx(0.07)
    noisy = across_repeats([run(100), run(120), run(95)])["output_throughput"]
    assert noisy["marker"] == "noisy" and noisy["spread"] == pytest.approx(0.25)
    failed = across_repeats([run(100), run(100, failed=1)])
    assert failed["output_throughput"]["marker"] == "failure"
    assert failed["median_ttft_ms"]["marker"] == "failure"  # every metric of that level is marked
    assert marker([100, 110], False) == "stable"  # exactly 10 % is not above it
    assert marker([0, 0], False) == "stable" and marker([0, 0, 1], False) == "noisy"
    assert worst_marker(["stable", "noisy"]) == "noisy" and worst_marker(["noisy", "failure"]) == "failure"
