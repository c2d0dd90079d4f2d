"""The daemon's telemetry, built from its settings: telemetry/ takes plain values (it imports
nothing from daemon/), and the daemon hands in orjson's encoder for the trace records and maps a
trace file that cannot be opened to a settings error (one line at start-up)."""
from __future__ import annotations

import orjson

from pegainfer.daemon.settings import Settings, SettingsError
from pegainfer.telemetry.hub import Telemetry
from pegainfer.telemetry.setup import TraceFileError, build_telemetry


def telemetry_for(settings: Settings) -> Telemetry:
    try:
        return build_telemetry(trace_file=settings.trace_file, trace_file_max_bytes=settings.trace_file_max_mb << 20,
                               trace_file_backups=settings.trace_file_backups, otlp_endpoint=settings.otlp_endpoint,
                               debug_traces=settings.debug_traces, step_trace_every=settings.step_trace_every,
                               dumps=orjson.dumps,
                               resource_attributes={"pegainfer.backend": settings.backend,
                                                    "pegainfer.batch_invariant": settings.batch_invariant})
    except TraceFileError as e:
        raise SettingsError(str(e)) from None
