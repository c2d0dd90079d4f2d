"""The recent-span ring buffer behind GET /debug/traces (the daemon's route, daemon/debug_traces.py):
the last few thousand finished spans, kept in memory and rendered as the same OTLP/JSON lines the
trace file holds, so the viewer can be pointed at a live daemon instead of a file."""
from __future__ import annotations

import collections
import threading

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from pegainfer.telemetry import otlp_json

CAPACITY = 4096
SPANS_PER_LINE = 512


class RecentSpans(SpanProcessor):
    def __init__(self, capacity: int = CAPACITY) -> None:
        self._spans: collections.deque[ReadableSpan] = collections.deque(maxlen=capacity)
        self._lock = threading.Lock()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            self._spans.append(span)

    def snapshot(self, limit: int | None = None) -> list[ReadableSpan]:
        """The newest `limit` spans (all when None), oldest first."""
        with self._lock:
            spans = list(self._spans)
        return spans if limit is None else spans[max(0, len(spans) - limit):]

    def jsonl(self, limit: int | None = None, dumps: otlp_json.Dumps = otlp_json.stdlib_dumps) -> bytes:
        """The newest `limit` spans (all when None) as OTLP/JSON lines of up to SPANS_PER_LINE spans."""
        spans = self.snapshot(limit)
        return b"".join(otlp_json.line(spans[i:i + SPANS_PER_LINE], dumps) for i in range(0, len(spans), SPANS_PER_LINE))

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def shutdown(self) -> None:
        pass
