"""Tracing.end_child_span skips the tracer: a request's phase span must come out exactly as the
tracer's start_span/end under the request span would have made it, span id aside."""
from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from pegainfer.telemetry import otlp_json
from pegainfer.telemetry.recent import RecentSpans
from pegainfer.telemetry.tracing import Tracing


def _without_span_id(encoded: dict) -> dict:
    del encoded["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"]
    return encoded


def test_child_span_equals_the_tracers():
    exported, recent = InMemorySpanExporter(), RecentSpans()
    tracing = Tracing(recent=recent, processors=[SimpleSpanProcessor(exported)])
    root = tracing.tracer.start_span("text_completion m", kind=SpanKind.SERVER, start_time=1_000)
    attributes = {"pegainfer.phase": "decode", "gen_ai.response.id": "cmpl-1"}

    tracing.end_child_span("decode", root.get_span_context(), 2_000, 5_000, attributes)
    direct = exported.get_finished_spans()[-1]
    made = tracing.tracer.start_span("decode", context=trace.set_span_in_context(root), kind=SpanKind.INTERNAL,
                                     start_time=2_000, attributes=attributes)
    made.end(end_time=5_000)
    traced = exported.get_finished_spans()[-1]

    assert recent.snapshot()[-2] is direct  # every processor saw it
    for name in ("name", "kind", "parent", "start_time", "end_time", "resource", "instrumentation_scope",
                 "dropped_attributes", "dropped_links", "dropped_events", "events", "links"):
        assert getattr(direct, name) == getattr(traced, name), name
    assert dict(direct.attributes) == dict(traced.attributes)
    assert direct.context.trace_id == traced.context.trace_id == root.get_span_context().trace_id
    assert direct.context.trace_flags == traced.context.trace_flags and direct.context.trace_state == traced.context.trace_state
    assert direct.status.status_code == traced.status.status_code
    assert direct.context.span_id != traced.context.span_id
    assert _without_span_id(otlp_json.traces_data([direct])) == _without_span_id(otlp_json.traces_data([traced]))
