"""Builds the daemon's telemetry from its settings: the trace-record file when `trace_file` is
set, an OTLP/HTTP exporter when `otlp_endpoint` (or OTEL_EXPORTER_OTLP_ENDPOINT) is, the
recent-span buffer when `debug_traces` is, and engine step sampling from `step_trace_every`."""
from __future__ import annotations

from opentelemetry.sdk.trace.export import SpanExporter

from daemon.settings import SettingsError
from telemetry.hub import Telemetry
from telemetry.recent import RecentSpans
from telemetry.records import JsonlSpanExporter
from telemetry.tracing import Tracing

OTLP_TRACES_PATH = "/v1/traces"
OTLP_TIMEOUT_S = 5.0


def otlp_traces_url(endpoint: str) -> str:
    """OTEL_EXPORTER_OTLP_ENDPOINT is a base URL; the HTTP exporter wants the traces URL."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(OTLP_TRACES_PATH) else endpoint + OTLP_TRACES_PATH


def build_telemetry(settings) -> Telemetry:
    exporters: dict[str, SpanExporter] = {}
    if settings.trace_file:
        try:
            exporters["file"] = JsonlSpanExporter(settings.trace_file, max_bytes=settings.trace_file_max_mb << 20,
                                                  backups=settings.trace_file_backups)
        except OSError as e:  # a misconfigured path stops start-up with one line, not a traceback
            raise SettingsError(f"trace_file {settings.trace_file}: cannot open for writing: {e.strerror}") from None
    if settings.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporters["otlp"] = OTLPSpanExporter(endpoint=otlp_traces_url(settings.otlp_endpoint), timeout=OTLP_TIMEOUT_S)
    recent = RecentSpans() if settings.debug_traces else None
    return Telemetry(Tracing(exporters, recent=recent), step_trace_every=settings.step_trace_every)
