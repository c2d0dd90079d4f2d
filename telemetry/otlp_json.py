"""OTLP/JSON encoding of finished spans: one `TracesData` object per call, in the protobuf JSON
mapping the OTLP spec prescribes (camelCase fields, enums as integers, 64-bit integers as
strings, trace and span ids as lowercase hex, zero values left out), as the OpenTelemetry
Collector's file exporter writes it.

Written directly from the SDK's ReadableSpan rather than through the protobuf message and
json_format, which costs about 0.8 ms a span; this runs on the exporter's thread, but it holds
the GIL that the GPU thread needs too. For the same reason the JSON encoder is the caller's to
choose: the stdlib's by default, and the daemon hands in orjson's, ten times faster (telemetry
itself imports nothing beyond the stdlib, OpenTelemetry and prometheus-client)."""
from __future__ import annotations

import base64
import json
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext

_HAS_IS_REMOTE = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = 0x200  # SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK


def traces_data(spans: Sequence[ReadableSpan]) -> dict:
    """{"resourceSpans": [{"resource": ..., "scopeSpans": [{"scope": ..., "spans": [...]}]}]}"""
    groups: dict[Any, dict[Any, list[dict]]] = {}
    for span in spans:
        groups.setdefault(span.resource, {}).setdefault(span.instrumentation_scope, []).append(_span(span))
    out = []
    for resource, scopes in groups.items():
        scope_spans = []
        for scope, encoded in scopes.items():
            entry: dict[str, Any] = {"scope": _scope(scope), "spans": encoded}
            if scope is not None and scope.schema_url:
                entry["schemaUrl"] = scope.schema_url
            scope_spans.append(entry)
        rs: dict[str, Any] = {"resource": {"attributes": _attributes(resource.attributes)}, "scopeSpans": scope_spans}
        if resource.schema_url:
            rs["schemaUrl"] = resource.schema_url
        out.append(rs)
    return {"resourceSpans": out}


Dumps = Callable[[Any], bytes]  # an object to compact UTF-8 JSON (orjson.dumps is one)


def stdlib_dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON, as orjson writes it (but ten times slower)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def line(spans: Sequence[ReadableSpan], dumps: Dumps = stdlib_dumps) -> bytes:
    """One JSONL record (with its newline) holding `spans`."""
    return dumps(traces_data(spans)) + b"\n"


def _scope(scope) -> dict:
    if scope is None:
        return {}
    out = {"name": scope.name}
    if scope.version:
        out["version"] = scope.version
    return out


def _flags(ctx: SpanContext, parent: SpanContext | None) -> int:
    flags = int(ctx.trace_flags) | _HAS_IS_REMOTE
    return flags | _IS_REMOTE if parent is not None and parent.is_remote else flags


def _span(s: ReadableSpan) -> dict:
    ctx = s.get_span_context()
    out: dict[str, Any] = {"traceId": f"{ctx.trace_id:032x}", "spanId": f"{ctx.span_id:016x}"}
    if ctx.trace_state:
        out["traceState"] = ",".join(f"{k}={v}" for k, v in ctx.trace_state.items())
    if s.parent is not None:
        out["parentSpanId"] = f"{s.parent.span_id:016x}"
    out["flags"] = _flags(ctx, s.parent)
    out["name"] = s.name
    out["kind"] = s.kind.value + 1  # the SDK's INTERNAL is 0; OTLP's is 1 (0 is UNSPECIFIED)
    out["startTimeUnixNano"] = str(s.start_time)
    out["endTimeUnixNano"] = str(s.end_time)
    if s.attributes:
        out["attributes"] = _attributes(s.attributes)
    if s.dropped_attributes:
        out["droppedAttributesCount"] = s.dropped_attributes
    if s.events:
        out["events"] = [_event(e) for e in s.events]
    if s.dropped_events:
        out["droppedEventsCount"] = s.dropped_events
    if s.links:
        out["links"] = [_link(link) for link in s.links]
    if s.dropped_links:
        out["droppedLinksCount"] = s.dropped_links
    status: dict[str, Any] = {}
    if s.status.description:
        status["message"] = s.status.description
    if s.status.status_code.value:
        status["code"] = s.status.status_code.value
    out["status"] = status
    return out


def _event(e) -> dict:
    out: dict[str, Any] = {"timeUnixNano": str(e.timestamp), "name": e.name}
    if e.attributes:
        out["attributes"] = _attributes(e.attributes)
    if e.dropped_attributes:
        out["droppedAttributesCount"] = e.dropped_attributes
    return out


# Link -> its encoding. A request's link object is shared by every engine-step span of its batch
# (telemetry.request_spans), so most links are encoded once instead of once per step.
_LINKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _link(link) -> dict:
    out = _LINKS.get(link)
    if out is None:
        out = _LINKS[link] = _encode_link(link)
    return out


def _encode_link(link) -> dict:
    ctx = link.context
    out: dict[str, Any] = {"traceId": f"{ctx.trace_id:032x}", "spanId": f"{ctx.span_id:016x}"}
    if ctx.trace_state:
        out["traceState"] = ",".join(f"{k}={v}" for k, v in ctx.trace_state.items())
    if link.attributes:
        out["attributes"] = _attributes(link.attributes)
    if link.dropped_attributes:
        out["droppedAttributesCount"] = link.dropped_attributes
    out["flags"] = _flags(ctx, ctx)
    return out


def _attributes(attributes: Mapping[str, Any] | None) -> list[dict]:
    return [{"key": str(k), "value": _value(v)} for k, v in (attributes or {}).items()]


def _value(v: Any) -> dict:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, str):
        return {"stringValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, bytes):
        return {"bytesValue": base64.b64encode(v).decode()}
    if isinstance(v, Mapping):
        return {"kvlistValue": {"values": _attributes(v)}}
    if isinstance(v, Sequence):
        return {"arrayValue": {"values": [_value(x) for x in v]}}
    return {} if v is None else {"stringValue": str(v)}
