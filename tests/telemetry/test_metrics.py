"""Metrics from hand-built engine steps and requests: inter-token latency from consecutive steps
of one request, terminal and token counters, scrape-time gauges, dropped spans, backend info."""
from __future__ import annotations

from pegainfer.engine.contract import EngineSnapshot, StepRecord
from pegainfer.lifecycle.scheduler import Scheduler
from pegainfer.telemetry.metrics import Metrics
from tests.lifecycle.fakes import FakeClock, FakeEngine, make_request
from tests.telemetry.prom import value


def record(step: int, ids: list[str], started_ms: int, cpu_ms: int = 4) -> StepRecord:
    return StepRecord(step=step, phase="decode", request_ids=ids, rows=len(ids), decode_rows=len(ids), prefill_tokens=0,
                      positions_max=step, started_ns=started_ms * 10**6, cpu_s=cpu_ms / 1e3, gpu_s=None,
                      routes_per_rank=[], routes_per_expert=[], collective_calls=0, collective_bytes=0, exchange_s=0.0,
                      kv_slots_used=len(ids))


def render(m: Metrics, scheduler=None, engine=None, dropped=None) -> str:
    payload, content_type = m.render(scheduler.snapshot() if scheduler else None, engine, dropped or {})
    assert content_type.startswith("text/plain")
    return payload.decode()


def test_inter_token_latency_from_consecutive_steps_of_a_request():
    m = Metrics()
    clock = FakeClock()
    scheduler = Scheduler(FakeEngine(), max_active=2, max_pending=0, clock=clock, observer=m)
    scheduler.set_ready(True)
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
    assert value(text, "pegainfer:engine_step_duration_seconds_count", phase="decode") == 3
    assert m._last_token_ns.keys() == {"a"}  # b was forgotten at the step after its end


def test_scrape_time_gauges_dropped_spans_and_backend_info():
    m = Metrics()
    m.set_engine("nccl", "experimental", "lite")
    m.set_engine("local", "production", "tiny", batch_invariant=True)
    m.on_front_rejection()
    engine = EngineSnapshot(steps=9, decode_batch_max=2, running=3, waiting=0, overlapped_steps=0, async_scheduling=True,
                            kv_slots_free=5, kv_slots_total=8)  # as the GPU thread publishes it
    text = render(m, engine=engine, dropped={"file": 3, "otlp": 0})
    assert value(text, "pegainfer:kv_slots_used") == 3 and value(text, "pegainfer:kv_slots_total") == 8
    assert value(text, "pegainfer:dropped_spans_total", exporter="file") == 3
    assert value(text, "pegainfer:requests_terminal_total", terminal_reason="rejected") == 1
    assert value(text, "pegainfer:backend_info", backend="local", maturity="production", model="tiny",
                 batch_invariant="true") == 1
    assert 'backend="nccl"' not in text


def test_step_histogram_takes_n_equal_observations_as_n_observe_calls():
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from pegainfer.telemetry.metrics import ITL_BUCKETS, _StepHistogram

    values = [(0.0, 3), (0.001, 2), (0.0012, 5), (0.25, 1), (5.0, 4), (9.5, 2)]  # on, between and past bounds
    a, b = CollectorRegistry(), CollectorRegistry()
    one_by_one = Histogram("h", "doc", buckets=ITL_BUCKETS, registry=a)
    batched = _StepHistogram("h", "doc", buckets=ITL_BUCKETS, registry=b)
    for v, n in values:
        for _ in range(n):
            one_by_one.observe(v)
        batched.observe_n(v, n)
    strip = lambda text: [x for x in text.decode().splitlines() if "_created" not in x]  # noqa: E731
    assert strip(generate_latest(a)) == strip(generate_latest(b))
