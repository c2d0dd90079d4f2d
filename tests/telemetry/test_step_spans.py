"""Engine-step spans skip the tracer (Tracing.end_root_span): they must come out exactly as the
tracer's start_span/end would have made them, ids aside, through every processor."""
from __future__ import annotations

from opentelemetry.context import Context
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind

from pegainfer.engine.contract import StepRecord
from pegainfer.telemetry import otlp_json
from pegainfer.telemetry.engine_info import EngineInfo
from pegainfer.telemetry.recent import RecentSpans
from pegainfer.telemetry.step_spans import StepSpans
from pegainfer.telemetry.tracing import MAX_LINKS, Tracing


def _record(ids: list[str]) -> StepRecord:
    return StepRecord(step=7, phase="decode", request_ids=ids, rows=len(ids), decode_rows=len(ids), prefill_tokens=0,
                      positions_max=99, started_ns=1_700_000_000_000_000_000, cpu_s=0.0083, gpu_s=0.0071,
                      routes_per_rank=[6 * len(ids)], routes_per_expert=[3, 0, 5], collective_calls=2,
                      collective_bytes=4096, exchange_s=0.001, kv_slots_used=len(ids))


def _without_ids(encoded: dict) -> dict:
    span = encoded["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    del span["traceId"], span["spanId"]
    return encoded


def test_step_span_equals_the_tracers():
    exported, recent = InMemorySpanExporter(), RecentSpans()
    tracing = Tracing(recent=recent, processors=[SimpleSpanProcessor(exported)])
    engine = EngineInfo("local", "production", "m")
    requests = [tracing.tracer.start_span(f"r{i}") for i in range(3)]
    links = [Link(s.get_span_context(), {"pegainfer.request_id": f"cmpl-{i}"}) for i, s in enumerate(requests)]
    record = _record([f"cmpl-{i}" for i in range(3)])

    StepSpans(tracing, engine).record(record, links)
    direct = exported.get_finished_spans()[-1]
    # the same span through the tracer, as StepSpans made it before
    attributes = {k: list(v) if isinstance(v, tuple) else v for k, v in direct.attributes.items()}
    made = tracing.tracer.start_span("engine_step decode", context=Context(), kind=SpanKind.INTERNAL,
                                     start_time=direct.start_time, attributes=attributes,
                                     links=[Link(link.context, dict(link.attributes)) for link in links])
    made.end(end_time=direct.end_time)
    traced = exported.get_finished_spans()[-1]

    assert recent.snapshot()[-2] is direct  # every processor saw it
    assert direct.end_time - direct.start_time == 8_300_000
    for name in ("name", "kind", "parent", "start_time", "end_time", "resource", "instrumentation_scope",
                 "dropped_attributes", "dropped_links", "events"):
        assert getattr(direct, name) == getattr(traced, name), name
    assert dict(direct.attributes) == dict(traced.attributes)
    assert direct.attributes["pegainfer.step.request_ids"] == ("cmpl-0", "cmpl-1", "cmpl-2")
    assert direct.context.trace_flags == traced.context.trace_flags and direct.context.trace_state == traced.context.trace_state
    assert direct.status.status_code == traced.status.status_code
    assert [(lk.context, dict(lk.attributes)) for lk in direct.links] == \
           [(lk.context, dict(lk.attributes)) for lk in traced.links]
    assert _without_ids(otlp_json.traces_data([direct])) == _without_ids(otlp_json.traces_data([traced]))
    assert direct.context.trace_id != traced.context.trace_id  # a new trace each


def test_step_span_keeps_the_link_limit():
    exported = InMemorySpanExporter()
    tracing = Tracing(processors=[SimpleSpanProcessor(exported)])
    ctx = tracing.tracer.start_span("r").get_span_context()
    StepSpans(tracing, EngineInfo()).record(_record(["a"]), [Link(ctx, {"pegainfer.request_id": "a"})] * (MAX_LINKS + 3))
    (span,) = exported.get_finished_spans()
    assert len(span.links) == MAX_LINKS and span.dropped_links == 3
