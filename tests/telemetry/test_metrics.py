"""Metrics from hand-built engine steps and requests: inter-token latency from consecutive steps
of one request, token counters that move per step, vLLM's per-request families at a request's end,
rejections by stage, scrape-time gauges, dropped spans, backend info; every sample labelled with the
model name; every vLLM family offered with vLLM's type, labels and bounds; only prometheus_client's
public API used."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from pegainfer.engine.contract import EngineSnapshot, StepRecord
from pegainfer.lifecycle.scheduler import Scheduler
from pegainfer.telemetry import buckets
from pegainfer.telemetry.metrics import Metrics
from pegainfer.telemetry.prom_collectors import BatchedHistogram
from tests.lifecycle.fakes import FakeClock, FakeEngine, make_request, tok
from tests.telemetry.prom import families, samples, total, value

ROOT = Path(__file__).resolve().parents[2]

# vLLM's families of the same meaning (vllm/v1/metrics/loggers.py): suffix -> (type, extra labels,
# vLLM's bucket bounds where a histogram's do not depend on max_model_len)
VLLM_FAMILIES = {
    "num_requests_running": ("gauge", set(), None),
    "num_requests_waiting": ("gauge", set(), None),
    "kv_cache_usage_perc": ("gauge", set(), None),
    "prompt_tokens": ("counter", set(), None),
    "generation_tokens": ("counter", set(), None),
    "num_preemptions": ("counter", set(), None),
    "request_success": ("counter", {"finished_reason"}, None),
    "time_to_first_token_seconds": ("histogram", set(), buckets.VLLM_TTFT),
    "inter_token_latency_seconds": ("histogram", set(), buckets.VLLM_ITL),
    "request_time_per_output_token_seconds": ("histogram", set(), buckets.VLLM_ITL),
    "e2e_request_latency_seconds": ("histogram", set(), buckets.VLLM_REQUEST_LATENCY),
    "request_queue_time_seconds": ("histogram", set(), buckets.VLLM_REQUEST_LATENCY),
    "request_inference_time_seconds": ("histogram", set(), buckets.VLLM_REQUEST_LATENCY),
    "request_prefill_time_seconds": ("histogram", set(), buckets.VLLM_REQUEST_LATENCY),
    "request_decode_time_seconds": ("histogram", set(), buckets.VLLM_REQUEST_LATENCY),
    "request_prompt_tokens": ("histogram", set(), None),
    "request_generation_tokens": ("histogram", set(), None),
    "request_params_max_tokens": ("histogram", set(), None),
    "request_params_n": ("histogram", set(), buckets.VLLM_PARAMS_N),
    "iteration_tokens_total": ("histogram", set(), buckets.VLLM_ITERATION_TOKENS),
}


def record(step: int, ids: list[str], started_ms: int, cpu_ms: int = 4, *, prefill_tokens: int = 0,
           draws: int | None = None) -> StepRecord:
    return StepRecord(step=step, phase="decode" if not prefill_tokens else "prefill", request_ids=ids, rows=len(ids),
                      decode_rows=len(ids), prefill_tokens=prefill_tokens, positions_max=step,
                      started_ns=started_ms * 10**6, cpu_s=cpu_ms / 1e3, gpu_s=None, routes_per_rank=[],
                      routes_per_expert=[], collective_calls=0, collective_bytes=0, exchange_s=0.0,
                      kv_slots_used=len(ids), draws=len(ids) if draws is None else draws)


def render(m: Metrics, scheduler=None, engine=None, dropped=None) -> str:
    payload, content_type = m.render(scheduler.snapshot() if scheduler else None, engine, dropped or {})
    assert content_type.startswith("text/plain")
    return payload.decode()


def scheduler_for(m: Metrics, clock: FakeClock | None = None, max_active: int = 2, max_pending: int = 0) -> Scheduler:
    s = Scheduler(FakeEngine(), max_active=max_active, max_pending=max_pending, clock=clock or FakeClock(),
                  observer=m)
    s.set_ready(True)
    return s


def test_inter_token_latency_from_consecutive_steps_of_a_request():
    m = Metrics()
    scheduler = scheduler_for(m)
    for rid in ("a", "b"):
        scheduler.submit(make_request(rid, max_tokens=2))
    m.on_step(record(1, ["a", "b"], 0))  # ends at 4 ms: first tokens
    m.on_step(record(2, ["a", "b"], 10))  # ends at 14 ms: 10 ms after the first
    scheduler.cancel("b")
    m.on_step(record(3, ["a"], 30))  # ends at 34 ms: 20 ms for a
    text = render(m, scheduler)
    assert value(text, "pegainfer:inter_token_latency_seconds_count") == 3
    assert abs(value(text, "pegainfer:inter_token_latency_seconds_sum") - 0.040) < 1e-9
    assert value(text, "pegainfer:num_requests_running") == 1 and value(text, "pegainfer:num_requests_waiting") == 0
    assert value(text, "pegainfer:requests_terminal_total", terminal_reason="cancelled") == 1
    assert value(text, "pegainfer:request_success_total", finished_reason="abort") == 1
    assert value(text, "pegainfer:engine_step_duration_seconds_count", phase="decode") == 3
    assert m._last_token_ns.keys() == {"a"}  # b was forgotten at the step after its end


def test_token_counters_move_with_each_step_not_at_the_end():
    m = Metrics()
    scheduler = scheduler_for(m)
    scheduler.submit(make_request("a", max_tokens=100, prompt=[1, 2, 3, 4, 5]))
    m.on_step(record(1, ["a"], 0, prefill_tokens=5, draws=1))
    for step in range(2, 6):
        m.on_step(record(step, ["a"], 10 * step))
    text = render(m, scheduler)
    assert scheduler.get("a") is not None  # still running
    assert value(text, "pegainfer:generation_tokens_total") == 5
    assert value(text, "pegainfer:prompt_tokens_total") == 5
    assert value(text, "pegainfer:iteration_tokens_total_count") == 5
    assert value(text, "pegainfer:iteration_tokens_total_sum") == 5 + 1 + 4
    assert value(text, "pegainfer:request_generation_tokens_count") == 0  # per-request: only at its end


def test_per_request_families_at_the_end_of_a_finished_request():
    m = Metrics()
    clock = FakeClock()
    scheduler = scheduler_for(m, clock, max_active=1, max_pending=1)
    m.set_engine("local", "production", "tiny", max_model_len=256)
    scheduler.submit(make_request("a", max_tokens=3, prompt=[1, 2, 3, 4]))
    scheduler.submit(make_request("b", max_tokens=3))  # queued behind a
    clock.tick(0.5)
    scheduler.on_prefill_started("a")
    clock.tick(0.25)
    scheduler.on_token(tok("a", 7), 1)  # first token: 0.75 s after receipt
    for _ in range(2):
        clock.tick(0.1)
        scheduler.on_token(tok("a", 8), 1)
    scheduler.on_finished("a", "length")  # b is admitted now, a second after it came
    scheduler.cancel("b")
    text = render(m, scheduler)
    assert value(text, "pegainfer:request_success_total", finished_reason="length") == 1
    assert value(text, "pegainfer:request_success_total", finished_reason="abort") == 1
    assert value(text, "pegainfer:request_success_total", finished_reason="stop") == 0  # present at 0
    assert value(text, "pegainfer:request_prompt_tokens_count") == 2
    assert value(text, "pegainfer:request_prompt_tokens_sum") == 4 + 3
    assert value(text, "pegainfer:request_generation_tokens_sum") == 3
    assert value(text, "pegainfer:request_params_max_tokens_sum") == 6
    assert value(text, "pegainfer:request_params_n_sum") == 2
    assert value(text, "pegainfer:request_prefill_time_seconds_sum") == pytest.approx(0.25)
    assert value(text, "pegainfer:request_decode_time_seconds_sum") == pytest.approx(0.2)
    assert value(text, "pegainfer:request_time_per_output_token_seconds_sum") == pytest.approx(0.1)
    assert value(text, "pegainfer:request_inference_time_seconds_sum") == pytest.approx(0.45)  # b: 0 s
    assert value(text, "pegainfer:e2e_request_latency_seconds_sum") == pytest.approx(0.95 + 0.95)
    assert value(text, "pegainfer:time_to_first_token_seconds_sum") == pytest.approx(0.75)
    assert value(text, "pegainfer:request_prompt_tokens_bucket", le="+Inf") == 2
    assert value(text, "pegainfer:request_prompt_tokens_bucket", le="200.0") == 2
    assert value(text, "pegainfer:request_prompt_tokens_bucket", le="500.0") == 0  # past max_model_len 256: none


def test_rejections_by_stage_and_code_agree_with_the_terminal_total():
    m = Metrics()
    scheduler = scheduler_for(m, max_active=1, max_pending=0)
    m.on_front_rejection("invalid_api_key")
    m.on_front_rejection("invalid_api_key")
    m.on_front_rejection(None)  # a plain 400
    scheduler.submit(make_request("a"))
    with pytest.raises(Exception):
        scheduler.submit(make_request("b"))  # queue full
    scheduler.reject(make_request("c"), "too long", code="context_length_exceeded")
    text = render(m, scheduler)
    assert m.rejections() == {"front": 3, "scheduler": 2}
    assert scheduler.snapshot()["rejected"] == m.rejections()["scheduler"]
    assert value(text, "pegainfer:requests_rejected_total", stage="front", code="invalid_api_key") == 2
    assert value(text, "pegainfer:requests_rejected_total", stage="front", code="invalid_request") == 1
    assert value(text, "pegainfer:requests_rejected_total", stage="scheduler", code="queue_full") == 1
    assert value(text, "pegainfer:requests_rejected_total", stage="scheduler", code="context_length_exceeded") == 1
    assert total(text, "pegainfer:requests_rejected_total") == 5
    assert value(text, "pegainfer:requests_terminal_total", terminal_reason="rejected") == 5
    assert total(text, "pegainfer:request_success_total") == 0  # never accepted: not vLLM's request_success


def test_scrape_time_gauges_dropped_spans_and_backend_info():
    m = Metrics("served-name")
    m.set_engine("nccl", "experimental", "lite")
    m.set_engine("local", "production", "tiny", batch_invariant=True)
    engine = EngineSnapshot(steps=9, decode_batch_max=2, running=3, waiting=0, overlapped_steps=0, async_scheduling=True,
                            kv_slots_free=5, kv_slots_total=8)  # as the GPU thread publishes it
    text = render(m, engine=engine, dropped={"file": 3, "otlp": 0})
    assert value(text, "pegainfer:kv_slots_used") == 3 and value(text, "pegainfer:kv_slots_total") == 8
    assert value(text, "pegainfer:kv_cache_usage_perc") == 3 / 8
    assert value(text, "pegainfer:dropped_spans_total", exporter="file") == 3
    assert value(text, "pegainfer:backend_info", backend="local", maturity="production", model="tiny",
                 batch_invariant="true", model_name="served-name") == 1
    assert 'backend="nccl"' not in text


def test_every_sample_carries_the_model_name_and_vllm_families_match():
    m = Metrics("my-model")
    m.set_engine("local", "production", "tiny", max_model_len=4096)
    m.on_front_rejection("invalid_api_key")
    text = render(m, scheduler_for(m), EngineSnapshot(1, 1, 0, 0, 0, True, 4, 4), {"file": 0})
    parsed = samples(text)
    assert parsed and all(dict(labels).get("model_name") == "my-model" for _, labels in parsed)
    fams = families(text)
    for suffix, (kind, labels, bounds) in VLLM_FAMILIES.items():
        family = fams.get("pegainfer:" + suffix)
        assert family is not None, suffix
        assert family.type == kind, (suffix, family.type)
        names = {k for s in family.samples for k in s.labels} - {"le"}
        assert names == {"model_name"} | labels, (suffix, names)
        if bounds is not None:  # every one of vLLM's bounds is there (pegainfer may add finer ones)
            les = {float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")}
            assert set(bounds) <= les, (suffix, sorted(set(bounds) - les))
    assert {s.labels["finished_reason"] for s in fams["pegainfer:request_success"].samples} == \
        {"stop", "length", "abort", "error"}
    les = [s.labels["le"] for s in fams["pegainfer:request_prompt_tokens"].samples if s.name.endswith("_bucket")]
    assert les[:7] == ["1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0"] and les[-2:] == ["2000.0", "+Inf"]


def test_batched_histogram_takes_n_equal_observations_as_n_observe_calls():
    values = [(0.0, 3), (0.001, 2), (0.0012, 5), (0.25, 1), (5.0, 4), (9.5, 2), (100.0, 1)]  # on, between, past
    a, b = CollectorRegistry(), CollectorRegistry()
    one_by_one = Histogram("h", "doc", buckets=buckets.ITL, registry=a)
    batched = BatchedHistogram("h", "doc", buckets.ITL)
    b.register(batched)
    for v, n in values:
        for _ in range(n):
            one_by_one.observe(v)
        batched.observe_n(v, n)
    strip = lambda text: [x for x in text.decode().splitlines() if "_created" not in x]  # noqa: E731
    assert strip(generate_latest(a)) == strip(generate_latest(b))
    assert batched.count == sum(n for _, n in values)
    with pytest.raises(ValueError):
        BatchedHistogram("bad", "doc", [0.1, 0.1, 0.2])


def test_telemetry_uses_only_public_prometheus_api():
    """No reaching into prometheus_client's objects: no private attributes (_sum, _buckets, _value,
    _upper_bounds, _raise_if_not_observable...), no private modules."""
    private = re.compile(r"\.(_sum|_buckets|_value|_upper_bounds|_raise_if_not_observable|_metrics|_labelnames"
                         r"|_collector_to_names|_names_to_collectors)\b|prometheus_client\.\w*\._")
    for path in sorted((ROOT / "telemetry").glob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            assert not private.search(line), f"{path.name}:{n}: {line.strip()}"


def test_docs_list_exactly_the_families_rendered():
    m = Metrics()
    m.set_engine("local", "production", "tiny", max_model_len=4096)
    text = render(m, scheduler_for(m), EngineSnapshot(1, 1, 0, 0, 0, True, 4, 4), {"file": 0})
    rendered = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    rendered = {name for name in rendered if not name.endswith("_created")}
    documented = set(re.findall(r"`(pegainfer:\w+)`", (ROOT / "docs" / "metrics.md").read_text()))
    assert documented == rendered, (sorted(documented - rendered), sorted(rendered - documented))
