"""The tracing pipeline one Telemetry instance owns: its own TracerProvider (never the global one),
the W3C trace-context propagator for incoming `traceparent` headers, and the span processors that
export (trace file, OTLP/HTTP collector) or keep (recent spans for /debug/traces)."""
from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Tracer, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from pegainfer.telemetry.export import GatedBatchProcessor
from pegainfer.telemetry.recent import RecentSpans

SCOPE = "pegainfer"
VERSION = "0.1.0"
MAX_LINKS = 1024  # an engine step links every request in its batch


class Tracing:
    def __init__(self, exporters: Mapping[str, SpanExporter] | None = None, *, recent: RecentSpans | None = None,
                 processors: list[SpanProcessor] | None = None,
                 resource_attributes: Mapping[str, str | bool | int] | None = None) -> None:
        """`exporters` by name ("file", "otlp"), each behind its own gated batch processor;
        `processors` are added as they are (tests use a SimpleSpanProcessor with an in-memory exporter);
        `resource_attributes`: what every span of this process shares beside the service's identity
        (the daemon's: the EP backend and pegainfer.batch_invariant)."""
        resource = Resource.create({"service.name": SCOPE, "service.version": VERSION,
                                    "service.instance.id": f"{socket.gethostname()}:{os.getpid()}",
                                    **(resource_attributes or {})})
        # ALWAYS_ON, not parent-based: every request gets its record, even under an unsampled caller
        self.provider = TracerProvider(resource=resource, sampler=ALWAYS_ON,
                                       span_limits=SpanLimits(max_links=MAX_LINKS), shutdown_on_exit=True)
        self.gated = [GatedBatchProcessor(exporter, name) for name, exporter in (exporters or {}).items()]
        self.recent = recent
        self._processors = [*self.gated, *([recent] if recent else []), *(processors or [])]
        for p in self._processors:
            self.provider.add_span_processor(p)
        self.tracer: Tracer = self.provider.get_tracer(SCOPE, VERSION)
        self._scope = InstrumentationScope(SCOPE, VERSION)  # the tracer's, by value
        ids = self.provider.id_generator
        self._root_flags = TraceFlags(TraceFlags.SAMPLED | (TraceFlags.RANDOM_TRACE_ID if ids.is_trace_id_random()
                                                            else 0))
        self._propagator = TraceContextTextMapPropagator()
        self._shut = False

    def extract(self, headers: Mapping[str, str] | None) -> Context | None:
        """The remote parent from a `traceparent` header, or None (a new trace)."""
        carrier = {k.lower(): v for k, v in (headers or {}).items()}
        if "traceparent" not in carrier:
            return None
        return self._propagator.extract(carrier)

    def end_child_span(self, name: str, parent: SpanContext, start_ns: int, end_ns: int, attributes: Mapping) -> None:
        """A finished INTERNAL span under `parent` (a request's phase spans: three per request), handed
        straight to the processors like end_root_span's, with what the tracer would give a child:
        the parent's trace id and trace state, ALWAYS_ON's sampled flag, the parent's random-trace-id
        flag, a new span id. The attributes must be clean (strings and numbers)."""
        flags = TraceFlags(TraceFlags.SAMPLED | (TraceFlags.RANDOM_TRACE_ID if parent.trace_flags.random_trace_id
                                                 else 0))
        ctx = SpanContext(parent.trace_id, self.provider.id_generator.generate_span_id(), is_remote=False,
                          trace_flags=flags, trace_state=parent.trace_state)
        span = ReadableSpan(name, ctx, parent, self.provider.resource, attributes, (), (), SpanKind.INTERNAL,
                            start_time=start_ns, end_time=end_ns, instrumentation_scope=self._scope)
        for p in self._processors:
            p.on_end(span)

    def end_root_span(self, name: str, start_ns: int, end_ns: int, attributes: Mapping, links: list[Link]) -> None:
        """A finished INTERNAL root span, handed straight to the processors as the tracer's span.end()
        would. For the engine-step spans, which link every request of their batch: start_span
        re-validates each link's attributes (about 3 µs a link, one per streamed token), while these
        come ready-made and clean, as do the attributes (strings, numbers and tuples of them). What
        the tracer would add is done here: ALWAYS_ON's sampled flag, new ids from the provider's
        generator, its resource, this tracer's scope, and the link limit."""
        ids = self.provider.id_generator
        ctx = SpanContext(ids.generate_trace_id(), ids.generate_span_id(), is_remote=False,
                          trace_flags=self._root_flags)
        span = ReadableSpan(name, ctx, None, self.provider.resource, attributes, (),
                            BoundedList.from_seq(MAX_LINKS, links), SpanKind.INTERNAL, start_time=start_ns,
                            end_time=end_ns, instrumentation_scope=self._scope)
        for p in self._processors:
            p.on_end(span)

    def dropped(self) -> dict[str, int]:
        """Spans refused because an exporter's queue was full, per exporter."""
        return {p.name: p.dropped for p in self.gated}

    def flush(self, timeout_millis: int = 10000) -> bool:
        return self.provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Export everything still queued, then close the exporters (idempotent)."""
        if not self._shut:
            self._shut = True
            self.provider.shutdown()
