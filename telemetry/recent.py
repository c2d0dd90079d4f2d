"""The recent-span ring buffer behind GET /debug/traces: the last few thousand finished spans,
kept in memory and served as the same OTLP/JSON lines the trace file holds, so the viewer can be
pointed at a live daemon instead of a file."""
from __future__ import annotations

import collections
import threading

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from telemetry import otlp_json

CAPACITY = 4096
SPANS_PER_LINE = 512
MEDIA_TYPE = "application/x-ndjson"


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

    def jsonl(self, limit: int | None = None) -> bytes:
        spans = self.snapshot(limit)
        return b"".join(otlp_json.line(spans[i:i + SPANS_PER_LINE]) for i in range(0, len(spans), SPANS_PER_LINE))

    def route(self) -> Route:
        """GET /debug/traces[?limit=N]: recent spans as OTLP/JSON lines."""
        async def traces(http: HTTPRequest) -> Response:
            raw = http.query_params.get("limit")
            if raw is not None and not (raw.isdigit() and int(raw) > 0):
                # the OpenAI error shape every other 4xx of the daemon has
                return JSONResponse({"error": {"message": f"limit must be a positive integer, got {raw[:50]!r}",
                                               "type": "invalid_request_error", "param": "limit", "code": None}},
                                    status_code=400)
            return Response(self.jsonl(int(raw) if raw else None), media_type=MEDIA_TYPE)

        return Route("/debug/traces", traces, methods=["GET"])

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def shutdown(self) -> None:
        pass
