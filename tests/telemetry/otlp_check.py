"""Structural checks of OTLP/JSON trace records, shared by the tests: the TracesData shape, hex
ids of the right lengths, required span fields, and a strict parse into the protobuf TracesData."""
from __future__ import annotations

import base64
import copy
import re

from google.protobuf.json_format import ParseDict
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")
ANY_VALUE_KEYS = {"stringValue", "intValue", "doubleValue", "boolValue", "arrayValue", "kvlistValue", "bytesValue"}


def check_line(data: dict) -> int:
    """Assert one JSONL record is a valid OTLP/JSON TracesData; return its span count."""
    assert set(data) == {"resourceSpans"}, data.keys()
    n = 0
    for rs in data["resourceSpans"]:
        assert isinstance(rs["resource"]["attributes"], list)
        assert {"key": "service.name", "value": {"stringValue": "pegainfer"}} in rs["resource"]["attributes"]
        for ss in rs["scopeSpans"]:
            assert ss["scope"]["name"] == "pegainfer"
            for span in ss["spans"]:
                check_span(span)
                n += 1
    _strict_parse(data)
    return n


def check_span(span: dict) -> None:
    assert HEX32.match(span["traceId"]) and span["traceId"] != "0" * 32, span["traceId"]
    assert HEX16.match(span["spanId"]) and span["spanId"] != "0" * 16, span["spanId"]
    if "parentSpanId" in span:
        assert HEX16.match(span["parentSpanId"]), span["parentSpanId"]
    assert isinstance(span["name"], str) and span["name"]
    assert span["kind"] in (1, 2), span["kind"]  # INTERNAL or SERVER
    start, end = span["startTimeUnixNano"], span["endTimeUnixNano"]
    assert isinstance(start, str) and start.isdigit() and isinstance(end, str) and end.isdigit()
    assert int(end) >= int(start) > 1_600_000_000 * 10**9
    assert isinstance(span["status"], dict)
    for kv in span.get("attributes", []):
        assert set(kv) == {"key", "value"} and len(set(kv["value"]) & ANY_VALUE_KEYS) == 1, kv
    for event in span.get("events", []):
        assert event["name"] and event["timeUnixNano"].isdigit()
    for link in span.get("links", []):
        assert HEX32.match(link["traceId"]) and HEX16.match(link["spanId"]), link


def _strict_parse(data: dict) -> None:
    """The record, with ids back in protobuf JSON's base64, parses into TracesData with no unknown field."""
    d = copy.deepcopy(data)
    for rs in d["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for obj in [span, *span.get("links", [])]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in obj:
                            obj[key] = base64.b64encode(bytes.fromhex(obj[key])).decode()
    ParseDict(d, TracesData(), ignore_unknown_fields=False)
