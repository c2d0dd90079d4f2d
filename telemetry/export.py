"""Export that never blocks a caller: a BatchSpanProcessor behind a gate that counts drops.

The SDK's BatchSpanProcessor already hands spans to its exporter on a worker thread and bounds
its queue, but when the queue is full it silently discards the oldest span. The gate in front of
it counts the spans handed over and the spans its exporter has received; once `max_queue_size`
are waiting, a new span is refused here and counted in `dropped`. Waiting spans never exceed the
processor's own bound, so every drop happens at the gate and is counted exactly once."""
from __future__ import annotations

import threading
from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

MAX_QUEUE_SIZE = 8192
MAX_EXPORT_BATCH_SIZE = 512
SCHEDULE_DELAY_MS = 500  # keeps the trace file no more than about half a second behind


class _CountingExporter(SpanExporter):
    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.received = 0
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            self.received += len(spans)
        return self.inner.export(spans)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.inner.shutdown()


class GatedBatchProcessor(SpanProcessor):
    def __init__(self, exporter: SpanExporter, name: str, *, max_queue_size: int = MAX_QUEUE_SIZE,
                 max_export_batch_size: int = MAX_EXPORT_BATCH_SIZE,
                 schedule_delay_millis: float = SCHEDULE_DELAY_MS) -> None:
        self.name = name
        self.max_queue_size = max_queue_size
        self.dropped = 0
        self._handed = 0
        self._lock = threading.Lock()
        self._counting = _CountingExporter(exporter)
        self._batch = BatchSpanProcessor(self._counting, max_queue_size=max_queue_size,
                                         max_export_batch_size=min(max_export_batch_size, max_queue_size),
                                         schedule_delay_millis=schedule_delay_millis)

    @property
    def exporter(self) -> SpanExporter:
        return self._counting.inner

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:
            return
        with self._lock:
            if self._handed - self._counting.received >= self.max_queue_size:
                self.dropped += 1
                return
            self._handed += 1
        self._batch.on_end(span)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._batch.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self._batch.shutdown()
