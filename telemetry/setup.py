"""Builds a Telemetry from plain values: the trace-record file when `trace_file` is set, an
OTLP/HTTP exporter when `otlp_endpoint` is, the recent-span buffer when `debug_traces` is, and
engine step sampling from `step_trace_every`. The daemon reads these from its settings
(daemon/telemetry_setup.py) and hands in its JSON encoder."""
from __future__ import annotations

from opentelemetry.sdk.trace.export import SpanExporter

from pegainfer.telemetry import otlp_json
from pegainfer.telemetry.hub import Telemetry
from pegainfer.telemetry.recent import RecentSpans
from pegainfer.telemetry.records import BACKUPS, MAX_BYTES, JsonlSpanExporter
from pegainfer.telemetry.tracing import Tracing

OTLP_TRACES_PATH = "/v1/traces"
OTLP_TIMEOUT_S = 5.0


class TraceFileError(ValueError):
    """The trace-record file cannot be opened: one line for the operator, not a traceback."""


def otlp_traces_url(endpoint: str) -> str:
    """OTEL_EXPORTER_OTLP_ENDPOINT is a base URL; the HTTP exporter wants the traces URL."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(OTLP_TRACES_PATH) else endpoint + OTLP_TRACES_PATH


def build_telemetry(*, trace_file: str | None = None, trace_file_max_bytes: int = MAX_BYTES,
                    trace_file_backups: int = BACKUPS, otlp_endpoint: str | None = None, debug_traces: bool = False,
                    step_trace_every: int = 1, dumps: otlp_json.Dumps = otlp_json.stdlib_dumps,
                    resource_attributes: dict[str, str | bool | int] | None = None) -> Telemetry:
    exporters: dict[str, SpanExporter] = {}
    if trace_file:
        try:
            exporters["file"] = JsonlSpanExporter(trace_file, max_bytes=trace_file_max_bytes,
                                                  backups=trace_file_backups, dumps=dumps)
        except OSError as e:
            raise TraceFileError(f"trace_file {trace_file}: cannot open for writing: {e.strerror}") from None
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporters["otlp"] = OTLPSpanExporter(endpoint=otlp_traces_url(otlp_endpoint), timeout=OTLP_TIMEOUT_S)
    recent = RecentSpans() if debug_traces else None
    return Telemetry(Tracing(exporters, recent=recent, resource_attributes=resource_attributes),
                     step_trace_every=step_trace_every)
