"""The server's side of each request: request root spans read back from the daemon's trace-record
files (OTLP/JSON lines, parsed by tools/traceview/reader.py) and indexed by trace id, which is the
id the runner put in each request's traceparent."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tools.traceview.reader import ROOT_PREFIX, SpanRecord, parse_lines, whole_lines

# The attributes joined into each request's entry in the artifact.
JOINED = {
    "terminal_reason": "pegainfer.terminal_reason", "response_id": "gen_ai.response.id",
    "output_hash": "pegainfer.output_hash", "output_tokens": "gen_ai.usage.output_tokens",
    "active_set_size_max": "pegainfer.active_set_size_max",
    "decode_batch_size_max": "pegainfer.decode_batch_size_max",
    "pending_depth_at_admit": "pegainfer.pending_depth_at_admit", "queue_s": "pegainfer.queue_s",
    "http_status": "http.response.status_code", "error": "pegainfer.error", "backend": "pegainfer.backend",
    "backend_maturity": "pegainfer.backend_maturity",
}


@dataclasses.dataclass(slots=True)
class RootSpan:
    trace_id: str
    span_id: str
    name: str
    attributes: dict[str, Any]

    @property
    def reason(self) -> str | None:
        value = self.attributes.get("pegainfer.terminal_reason")
        return None if value is None else str(value)

    def joined(self) -> dict[str, Any]:
        out = {k: self.attributes.get(attr) for k, attr in JOINED.items()}
        if isinstance(out["error"], str):
            out["error"] = out["error"][:200]
        return out


SpanIndex = dict[str, list[RootSpan]]  # trace id -> request root spans in that trace


def is_request_root(s: SpanRecord) -> bool:
    return s.name.startswith(ROOT_PREFIX) and s.attributes.get("gen_ai.operation.name") == ROOT_PREFIX


def index(spans: Iterable[SpanRecord]) -> SpanIndex:
    out: SpanIndex = {}
    for s in spans:
        if is_request_root(s):
            out.setdefault(s.trace_id, []).append(RootSpan(s.trace_id, s.span_id, s.name, s.attributes))
    return out


def read(paths: Iterable[Path]) -> SpanIndex:
    """Every request root span in these files and the files the daemon rotated them into (each span
    once). A line still being written is skipped, as is a file that does not exist (yet)."""
    spans: dict[tuple[str, str], SpanRecord] = {}
    for path in paths:
        for line in whole_lines(path):
            try:
                for s in parse_lines(line):
                    spans.setdefault((s.trace_id, s.span_id), s)
            except (ValueError, KeyError, TypeError):
                continue
    return index(spans.values())


def read_until_covered(paths: list[Path], trace_ids: set[str], wait_s: float) -> SpanIndex:
    """Spans are exported in batches about half a second behind: re-read until every trace id has
    a span or `wait_s` has passed."""
    deadline = time.monotonic() + wait_s
    while True:
        found = read(paths)
        if trace_ids <= found.keys() or time.monotonic() >= deadline:
            return found
        time.sleep(0.25)
