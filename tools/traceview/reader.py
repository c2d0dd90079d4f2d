"""Reads trace records back: OTLP/JSON lines (the trace file, or GET /debug/traces) into plain span
records, and those into the viewer's model, one RequestView per request root span and one StepView
per engine step span. Standard library only, so the viewer runs wherever the trace file is copied."""
from __future__ import annotations

import dataclasses
import glob
import json
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

ROOT_PREFIX = "text_completion"
STEP_PREFIX = "engine_step"
PHASES = ("queue", "prefill", "decode")


@dataclasses.dataclass(slots=True)
class SpanRecord:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]]
    links: list[tuple[str, str, dict[str, Any]]]
    status_code: int
    status_message: str


@dataclasses.dataclass(slots=True)
class RequestView:
    request_id: str
    trace_id: str
    span_id: str
    start_ns: int
    end_ns: int
    terminal_reason: str
    attributes: dict[str, Any]
    phases: dict[str, tuple[int, int]]  # queue / prefill / decode -> (start_ns, end_ns)
    first_token_ns: int | None
    steps: list[int] = dataclasses.field(default_factory=list)  # engine step indexes it took part in


@dataclasses.dataclass(slots=True)
class StepView:
    index: int
    phase: str
    start_ns: int
    end_ns: int
    request_ids: list[str]
    attributes: dict[str, Any]


def any_value(v: dict) -> Any:
    """An OTLP/JSON AnyValue as a Python value (64-bit ints arrive as strings)."""
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [any_value(x) for x in v["arrayValue"].get("values", [])]
    if "kvlistValue" in v:
        return attributes(v["kvlistValue"].get("values", []))
    if "bytesValue" in v:
        return v["bytesValue"]
    return None


def attributes(kvs: Iterable[dict]) -> dict[str, Any]:
    return {kv["key"]: any_value(kv.get("value", {})) for kv in kvs}


def parse_lines(text: str) -> list[SpanRecord]:
    """Every span in a text of OTLP/JSON TracesData lines (blank lines skipped)."""
    out = []
    for number, raw in enumerate(text.split("\n"), 1):  # JSONL: not splitlines (U+2028 may sit in a line)
        if not raw.strip():
            continue
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"line {number}: not JSON: {e}") from None
        for rs in data.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                out += [_span(s) for s in ss.get("spans", [])]
    return out


def _span(s: dict) -> SpanRecord:
    return SpanRecord(
        trace_id=s["traceId"], span_id=s["spanId"], parent_span_id=s.get("parentSpanId", ""), name=s["name"],
        kind=int(s.get("kind", 0)), start_ns=int(s["startTimeUnixNano"]), end_ns=int(s["endTimeUnixNano"]),
        attributes=attributes(s.get("attributes", [])),
        events=[(e["name"], int(e["timeUnixNano"]), attributes(e.get("attributes", []))) for e in s.get("events", [])],
        links=[(x["traceId"], x["spanId"], attributes(x.get("attributes", []))) for x in s.get("links", [])],
        status_code=int(s.get("status", {}).get("code", 0)), status_message=s.get("status", {}).get("message", ""))


def record_files(path: str | Path) -> list[Path]:
    """The trace-record file and the files it was rotated into, newest first: FILE, FILE.1, FILE.2, ...
    (telemetry/records.py renames FILE to FILE.1 once it is full). Only the files that exist."""
    path = Path(path)
    rotated = [Path(q) for q in glob.glob(glob.escape(str(path)) + ".*")]
    rotated = sorted((q for q in rotated if q.suffix[1:].isdigit()), key=lambda q: int(q.suffix[1:]))
    return ([path] if path.is_file() else []) + rotated


def _complete(f: Path) -> str:
    """f's text up to its last newline: a line the daemon is still writing is left out, as is a file
    rotated away between the listing and the read (a reader that polls sees it on the next read)."""
    try:
        text = f.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return text[: text.rfind("\n") + 1]


def whole_lines(path: str | Path) -> Iterator[str]:
    """Every complete line of the trace-record file and its rotated files, newest file first."""
    for f in record_files(path):
        yield from _complete(f).split("\n")[:-1]


def load(source: str) -> list[SpanRecord]:
    """Spans from a JSONL trace-record file and its rotated files, or from a URL (a daemon's
    /debug/traces). A span read twice (its file was rotated while we read) is kept once."""
    if source.startswith(("http://", "https://")):
        with urllib.request.urlopen(source, timeout=30) as response:  # noqa: S310 - the user's own URL
            return parse_lines(response.read().decode())
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError("no such trace file")
    spans: dict[tuple[str, str], SpanRecord] = {}
    for f in record_files(path):
        try:
            records = parse_lines(_complete(f))
        except ValueError as e:
            raise ValueError(f"{f.name}: {e}") from None
        for s in records:
            spans.setdefault((s.trace_id, s.span_id), s)
    return list(spans.values())


def build(spans: list[SpanRecord]) -> tuple[list[RequestView], list[StepView]]:
    """Requests (by start time) with their phases and steps, and engine steps (by index)."""
    children: dict[tuple[str, str], list[SpanRecord]] = {}
    for s in spans:
        if s.parent_span_id:
            children.setdefault((s.trace_id, s.parent_span_id), []).append(s)
    requests: dict[str, RequestView] = {}
    for s in spans:
        if not s.name.startswith(ROOT_PREFIX) or s.attributes.get("gen_ai.operation.name") != ROOT_PREFIX:
            continue
        rid = s.attributes.get("gen_ai.response.id") or f"front-{s.span_id}"
        phases = {c.name: (c.start_ns, c.end_ns) for c in children.get((s.trace_id, s.span_id), [])
                  if c.name in PHASES}
        first = next((t for name, t, _ in s.events if name == "first_token"), None)
        requests[rid] = RequestView(rid, s.trace_id, s.span_id, s.start_ns, s.end_ns,
                                    str(s.attributes.get("pegainfer.terminal_reason", "unknown")),
                                    s.attributes, phases, first)
    steps = []
    for s in spans:
        if not s.name.startswith(STEP_PREFIX):
            continue
        a = s.attributes
        ids = [str(x) for x in a.get("pegainfer.step.request_ids", [])]
        step = StepView(int(a.get("pegainfer.step.index", 0)), str(a.get("pegainfer.step.phase", "")),
                        s.start_ns, s.end_ns, ids, a)
        steps.append(step)
        for rid in ids:
            if rid in requests:
                requests[rid].steps.append(step.index)
    steps.sort(key=lambda x: (x.start_ns, x.index))
    return sorted(requests.values(), key=lambda r: (r.start_ns, r.request_id)), steps


def select(requests: list[RequestView], steps: list[StepView], *, reasons: set[str] | None = None,
           since_ns: int | None = None, until_ns: int | None = None) -> tuple[list[RequestView], list[StepView]]:
    """Requests with one of `reasons` that overlap [since, until]; steps in the window that involve
    a kept request (or all steps in the window when no reason filter is given)."""
    def overlaps(start: int, end: int) -> bool:
        return (since_ns is None or end >= since_ns) and (until_ns is None or start <= until_ns)

    kept = [r for r in requests if (not reasons or r.terminal_reason in reasons) and overlaps(r.start_ns, r.end_ns)]
    ids = {r.request_id for r in kept}
    kept_steps = [s for s in steps if overlaps(s.start_ns, s.end_ns) and (not reasons or ids & set(s.request_ids))]
    return kept, kept_steps
