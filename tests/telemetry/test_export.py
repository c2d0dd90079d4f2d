"""Where spans go: the JSONL trace-record file (OTLP/JSON, size rotation), the gate that counts
spans dropped on a full queue, OTLP/HTTP to a collector, and the recent-span buffer."""
from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from starlette.applications import Starlette
from starlette.testclient import TestClient

from pegainfer.daemon.settings import Settings, SettingsError
from tools.traceview import reader as trace_reader
from pegainfer.telemetry.export import GatedBatchProcessor
from pegainfer.telemetry.recent import RecentSpans
from pegainfer.telemetry.records import JsonlSpanExporter
from pegainfer.daemon.debug_traces import traces_route
from pegainfer.daemon.telemetry_setup import telemetry_for
from pegainfer.telemetry.setup import otlp_traces_url
from tests.telemetry.otlp_check import check_line


def finished_spans(n: int, name: str = "s", root_of: str | None = None):
    """n ended SDK spans (through a throwaway provider that keeps them); with `root_of`, request root
    spans of that model as the daemon writes them (response ids r0, r1, ..., terminal reason)."""
    kept = []

    class Keep(SpanExporter):
        def export(self, spans):
            kept.extend(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider(resource=Resource.create({"service.name": "pegainfer"}))
    provider.add_span_processor(SimpleSpanProcessor(Keep()))
    tracer = provider.get_tracer("pegainfer")
    for i in range(n):
        attributes = {"i": i, "tags": ["a", "b"]}
        if root_of:
            name = f"text_completion {root_of}"
            attributes.update({"gen_ai.operation.name": "text_completion", "gen_ai.response.id": f"r{i}",
                               "pegainfer.terminal_reason": "completed_length"})
        with tracer.start_as_current_span(name if root_of else f"{name}{i}", attributes=attributes) as span:
            span.add_event("e", {"x": 1.5})
    provider.shutdown()
    return kept


def test_jsonl_lines_are_otlp_json_and_rotate_by_size(tmp_path: Path):
    path = tmp_path / "deep" / "trace.jsonl"
    exporter = JsonlSpanExporter(path, max_bytes=3000, backups=2)
    for _ in range(12):
        assert exporter.export(finished_spans(2)) == SpanExportResult.SUCCESS
    exporter.shutdown()
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["trace.jsonl", "trace.jsonl.1", "trace.jsonl.2"]
    for f in path.parent.iterdir():
        assert f.stat().st_size <= 3000
        for line in f.read_text().splitlines():
            assert check_line(json.loads(line)) == 2
    assert exporter.export(finished_spans(1)) == SpanExportResult.FAILURE  # closed


def test_every_reader_reads_the_rotated_files_once(tmp_path: Path):
    """Under load the file rotates every few seconds (2026-12-03 on the H200: a c=256 benchmark found
    25 % of its requests in FILE because the rest were in FILE.1): the viewer's loader, the benchmark's
    join and the reliability runner's join read FILE.N ... FILE, each span once."""
    from tools.benchkit import traces
    from tools.reliakit import server_spans

    path = tmp_path / "trace.jsonl"
    exporter = JsonlSpanExporter(path, max_bytes=3000, backups=50)
    batches = [finished_spans(2, name=f"b{i}-") for i in range(12)]
    for batch in batches:
        assert exporter.export(batch) == SpanExportResult.SUCCESS
    exporter.shutdown()
    files = trace_reader.record_files(path)
    assert [f.name for f in files[:3]] == ["trace.jsonl", "trace.jsonl.1", "trace.jsonl.2"] and len(files) > 3
    want = sorted(s.name for batch in batches for s in batch)
    assert sorted(s.name for s in trace_reader.load(str(path))) == want
    # a reader that lists the files while they rotate can read one file's lines twice; a line still
    # being written (no newline yet) is not read
    (path.parent / f"trace.jsonl.{len(files)}").write_bytes(files[1].read_bytes())
    with path.open("a") as f:
        f.write('{"resourceSpans": [')
    assert sorted(s.name for s in trace_reader.load(str(path))) == want
    assert trace_reader.load(str(path.with_name("trace.jsonl.1")))  # a rotated file alone loads too
    with pytest.raises(FileNotFoundError):
        trace_reader.load(str(tmp_path / "none.jsonl"))
    (path.parent / "trace.jsonl.2").write_text("{not json\n")  # a corrupt line names its file and line
    with pytest.raises(ValueError, match=r"trace\.jsonl\.2: line 1: not JSON"):
        trace_reader.load(str(path))

    roots = finished_spans(4, root_of="m")
    exporter = JsonlSpanExporter(tmp_path / "roots.jsonl", max_bytes=1500, backups=8)
    for span in roots:
        exporter.export([span])
    exporter.shutdown()
    assert len(trace_reader.record_files(tmp_path / "roots.jsonl")) == 4
    assert set(traces.request_spans(tmp_path / "roots.jsonl")) == {"r0", "r1", "r2", "r3"}
    found = server_spans.read([tmp_path / "roots.jsonl"])
    assert sorted(r.attributes["gen_ai.response.id"] for spans in found.values() for r in spans) == ["r0", "r1", "r2", "r3"]


class BlockingExporter(SpanExporter):
    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.count = 0

    def export(self, spans):
        self.entered.set()
        self.release.wait(10)
        self.count += len(spans)
        return SpanExportResult.SUCCESS


def test_gate_counts_spans_dropped_while_the_exporter_is_stuck():
    exporter = BlockingExporter()
    gate = GatedBatchProcessor(exporter, "file", max_queue_size=2, schedule_delay_millis=60_000)
    spans = finished_spans(7)
    gate.on_end(spans[0])
    gate.on_end(spans[1])  # a full batch: the worker takes both and blocks in export
    assert exporter.entered.wait(10)
    for s in spans[2:]:
        gate.on_end(s)  # two fit in the queue again, three do not
    assert gate.dropped == 3
    exporter.release.set()
    gate.shutdown()
    assert exporter.count == 4 and gate.dropped == 3


class Collector(http.server.BaseHTTPRequestHandler):
    received: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - the http.server hook's name
        body = self.rfile.read(int(self.headers["content-length"]))
        Collector.received.append((self.path, self.headers["content-type"], body))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()
        self.wfile.write(b"")

    def log_message(self, *args) -> None:
        pass


def test_otlp_http_exporter_posts_to_the_collector(tmp_path: Path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings = Settings(otlp_endpoint=f"http://127.0.0.1:{server.server_address[1]}",
                            trace_file=str(tmp_path / "t.jsonl"))
        telemetry = telemetry_for(settings)
        telemetry.on_front_rejection(400, "bad JSON", None)
        telemetry.shutdown()
    finally:
        server.shutdown()
        server.server_close()
    (path, content_type, body), = Collector.received
    assert path == "/v1/traces" and content_type == "application/x-protobuf"
    request = ExportTraceServiceRequest.FromString(body)
    (span,) = request.resource_spans[0].scope_spans[0].spans
    assert span.name == "text_completion unknown" and span.kind == span.SPAN_KIND_SERVER
    (line,) = (tmp_path / "t.jsonl").read_text().splitlines()  # the file got the same span
    assert check_line(json.loads(line)) == 1
    assert otlp_traces_url("http://c:4318/") == "http://c:4318/v1/traces" == otlp_traces_url("http://c:4318/v1/traces")


def test_recent_buffer_and_route():
    recent = RecentSpans(capacity=5)
    for s in finished_spans(8):
        recent.on_end(s)
    assert [s.name for s in recent.snapshot()] == ["s3", "s4", "s5", "s6", "s7"]
    client = TestClient(Starlette(routes=[traces_route(recent)]))
    response = client.get("/debug/traces?limit=2")
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/x-ndjson")
    (line,) = response.text.splitlines()
    data = json.loads(line)
    assert check_line(data) == 2
    assert [s["name"] for s in data["resourceSpans"][0]["scopeSpans"][0]["spans"]] == ["s6", "s7"]
    bad = client.get("/debug/traces?limit=x")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"


def test_the_recent_buffer_exists_only_when_asked():
    assert telemetry_for(Settings()).tracing.recent is None
    assert isinstance(telemetry_for(Settings(debug_traces=True)).tracing.recent, RecentSpans)


def test_the_stdlib_encoder_writes_what_orjson_writes():
    """telemetry/ encodes with the stdlib unless handed an encoder; the daemon hands it orjson's."""
    import orjson

    from pegainfer.telemetry import otlp_json

    spans = finished_spans(4)
    assert otlp_json.line(spans) == otlp_json.line(spans, orjson.dumps)


def test_encoding_matches_the_sdk_protobuf_encoder():
    """The direct OTLP/JSON writer agrees with the SDK's protobuf encoder through json_format, except
    that span flags also carry the W3C trace flags in their low byte, as the OTLP spec defines."""
    import base64

    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from pegainfer.telemetry import otlp_json

    spans = finished_spans(3)
    reference = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    mine = otlp_json.traces_data(spans)
    for data, from_protobuf in ((reference, True), (mine, False)):
        for rs in data["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    for obj in [span, *span.get("links", [])]:
                        if from_protobuf:
                            for key in ("traceId", "spanId", "parentSpanId"):
                                if key in obj:
                                    obj[key] = base64.b64decode(obj[key]).hex()
                        obj["flags"] = obj.get("flags", 0) & ~0xFF
    assert json.dumps(mine, sort_keys=True) == json.dumps(reference, sort_keys=True)


def test_an_unwritable_trace_file_is_a_settings_error(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SettingsError, match="trace_file .*cannot open for writing"):
        telemetry_for(Settings(trace_file=str(blocker / "trace.jsonl")))


def test_trace_file_rotation_is_a_setting(tmp_path: Path):
    import argparse

    from pegainfer.daemon.settings import resolve

    settings = resolve(argparse.Namespace(trace_file=str(tmp_path / "t.jsonl"), trace_file_max_mb="2",
                                          trace_file_backups="0"), environ={})
    telemetry = telemetry_for(settings)
    (gate,) = telemetry.tracing.gated
    assert (gate.exporter.max_bytes, gate.exporter.backups) == (2 << 20, 0)
    telemetry.shutdown()
    for flag, value, message in (("trace_file_max_mb", "0", "at least 1"), ("trace_file_backups", "-1", ">= 0")):
        with pytest.raises(SettingsError, match=f"{flag} must be {message}"):
            resolve(argparse.Namespace(**{flag: value}), environ={})
