"""End to end: the trace file a real daemon writes (tiny model, CPU) holds one request span per
request with the agreed attributes, queue/prefill/decode children, engine step spans linked to
their requests, and valid OTLP/JSON, including what was still queued when SIGTERM came."""
from __future__ import annotations

import hashlib
import json

import pytest

from tests.telemetry.otlp_check import check_line
from tests.telemetry.run import FRONT_PARENT_SPAN_ID, FRONT_TRACE_ID, PARENT_SPAN_ID, TRACE_ID, DaemonRun
from tools.traceview.reader import SpanRecord

ROOT_ATTRS = ("gen_ai.operation.name", "gen_ai.request.model", "gen_ai.request.max_tokens", "gen_ai.request.stream",
              "gen_ai.response.id", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
              "pegainfer.terminal_reason", "pegainfer.active_set_size_max", "pegainfer.decode_batch_size_max",
              "pegainfer.pending_depth_at_admit", "pegainfer.output_hash", "pegainfer.backend",
              "pegainfer.backend_maturity")


def roots(spans: list[SpanRecord]) -> dict[str, SpanRecord]:
    out = {}
    for s in spans:
        if s.name.startswith("text_completion") and "gen_ai.response.id" in s.attributes:
            rid = s.attributes["gen_ai.response.id"]
            assert rid not in out, f"two root spans for {rid}"
            out[rid] = s
    return out


def children(spans: list[SpanRecord], root: SpanRecord) -> dict[str, SpanRecord]:
    kids = [s for s in spans if s.trace_id == root.trace_id and s.parent_span_id == root.span_id]
    assert len({k.name for k in kids}) == len(kids), [k.name for k in kids]
    return {k.name: k for k in kids}


@pytest.fixture(scope="module")
def spans(daemon_run: DaemonRun) -> list[SpanRecord]:
    assert daemon_run.exit_code == 0, daemon_run.log
    return daemon_run.spans()


def test_every_request_has_exactly_one_root_span_with_its_terminal_reason(daemon_run, spans):
    by_id = roots(spans)
    expected = {"length": "completed_length", "cancelled": "cancelled", "disconnected": "disconnected",
                "failed": "failed", "final": "completed_length",
                "stop": "completed_stop" if daemon_run.finish["stop"] == "stop" else "completed_length"}
    for scenario, reason in expected.items():
        root = by_id[daemon_run.ids[scenario]]
        assert root.attributes["pegainfer.terminal_reason"] == reason, scenario
        assert [e for e in root.events if e[0] == "terminal"][0][2]["pegainfer.terminal_reason"] == reason
    assert daemon_run.finish["stop"] == "stop", "the stop prompt no longer ends on EOS with the embedded model"
    # the scheduler-side rejection (over the context) and the front one (malformed JSON)
    rejected = [s for s in by_id.values() if s.attributes["pegainfer.terminal_reason"] == "rejected"]
    assert len(rejected) == 1 and rejected[0].attributes["http.response.status_code"] == 400
    assert rejected[0].attributes["error.type"] == "invalid_request"
    assert "maximum context length" in rejected[0].attributes["pegainfer.error"]
    # 4 batch + length, stop, cancelled, disconnected, failed, context rejection, final
    assert len(by_id) == 11


def test_root_span_attributes(daemon_run, spans):
    root = roots(spans)[daemon_run.ids["length"]]
    a = root.attributes
    assert root.kind == 2  # SERVER
    assert root.name == f"text_completion {a['gen_ai.request.model']}"
    for key in ROOT_ATTRS:
        assert key in a, key
    assert a["gen_ai.operation.name"] == "text_completion"
    assert a["gen_ai.request.max_tokens"] == 8 and a["gen_ai.request.stream"] is False
    assert a["gen_ai.usage.output_tokens"] == 8 and a["gen_ai.response.finish_reasons"] == ["length"]
    assert a["pegainfer.backend"] == "local" and a["pegainfer.backend_maturity"] == "production"
    assert a["pegainfer.batch_invariant"] is True
    for key in ("pegainfer.ttft_s", "pegainfer.queue_s", "pegainfer.prefill_s", "pegainfer.decode_s"):
        assert 0 <= a[key] < 30, key
    assert a["pegainfer.ttft_s"] == pytest.approx(a["pegainfer.queue_s"] + a["pegainfer.prefill_s"], abs=0.05)
    assert "error.type" not in a and root.status_code != 2
    assert len(a["pegainfer.output_hash"]) == 64 and int(a["pegainfer.output_hash"], 16) >= 0
    assert [e[0] for e in root.events] == ["first_token", "terminal"]


def test_output_hash_is_sha256_of_the_token_ids(daemon_run, spans):
    root = roots(spans)[daemon_run.ids["final"]]
    assert root.attributes["pegainfer.output_hash"] != hashlib.sha256(b"[]").hexdigest()
    rejected = next(s for s in roots(spans).values() if s.attributes["pegainfer.terminal_reason"] == "rejected")
    assert rejected.attributes["pegainfer.output_hash"] == hashlib.sha256(json.dumps([]).encode()).hexdigest()


def test_children_cover_queue_prefill_decode_in_order(daemon_run, spans):
    by_id = roots(spans)
    for scenario in ("length", "batch0", "batch3", "cancelled", "failed"):
        root = by_id[daemon_run.ids[scenario]]
        kids = children(spans, root)
        assert set(kids) == {"queue", "prefill", "decode"}, scenario
        q, p, d = kids["queue"], kids["prefill"], kids["decode"]
        times = [root.start_ns, q.start_ns, q.end_ns, p.start_ns, p.end_ns, d.start_ns, d.end_ns, root.end_ns]
        assert times == sorted(times), scenario
        assert d.end_ns == root.end_ns and d.start_ns == next(t for n, t, _ in root.events if n == "first_token")
    rejected = next(s for s in by_id.values() if s.attributes["pegainfer.terminal_reason"] == "rejected")
    assert children(spans, rejected) == {}


def test_queueing_and_batching_facts(daemon_run, spans):
    by_id = roots(spans)
    batch = [by_id[daemon_run.ids[f"batch{i}"]].attributes for i in range(4)]
    assert max(a["pegainfer.queue_s"] for a in batch) > 0.005  # two of four waited for a slot
    assert max(a["pegainfer.active_set_size_max"] for a in batch) == 2
    assert max(a["pegainfer.decode_batch_size_max"] for a in batch) == 2
    assert sum(a["pegainfer.pending_depth_at_admit"] for a in batch) >= 1


def test_failed_cancelled_disconnected_details(daemon_run, spans):
    by_id = roots(spans)
    failed = by_id[daemon_run.ids["failed"]]
    assert failed.attributes["error.type"] == "engine_failed" and failed.status_code == 2
    assert "injected failure" in failed.attributes["pegainfer.error"]
    for scenario in ("cancelled", "disconnected"):
        root = by_id[daemon_run.ids[scenario]]
        assert root.attributes["gen_ai.request.stream"] is True and root.attributes["gen_ai.request.max_tokens"] == 3000
        assert 1 <= root.attributes["gen_ai.usage.output_tokens"] < 3000
        assert "error.type" not in root.attributes and "gen_ai.response.finish_reasons" not in root.attributes
    assert "cancelled by API request" in by_id[daemon_run.ids["cancelled"]].attributes["pegainfer.error"]


def test_front_rejection_gets_a_root_span_parented_on_its_traceparent(spans):
    front = [s for s in spans if s.trace_id == FRONT_TRACE_ID]
    assert len(front) == 1
    root = front[0]
    assert root.parent_span_id == FRONT_PARENT_SPAN_ID and root.kind == 2
    assert root.attributes["pegainfer.terminal_reason"] == "rejected"
    assert root.attributes["http.response.status_code"] == 400 and root.attributes["error.type"] == "400"
    assert "not valid JSON" in root.attributes["pegainfer.error"] and root.status_code == 2


def test_traceparent_propagates_to_the_request_trace(daemon_run, spans):
    root = roots(spans)[daemon_run.ids["length"]]
    assert root.trace_id == TRACE_ID and root.parent_span_id == PARENT_SPAN_ID
    assert all(k.trace_id == TRACE_ID for k in children(spans, root).values())
    others = [s for rid, s in roots(spans).items() if rid != daemon_run.ids["length"]]
    assert all(s.trace_id != TRACE_ID and s.parent_span_id == "" for s in others)


def test_engine_steps_are_spans_linked_to_their_requests(daemon_run, spans):
    steps = [s for s in spans if s.name.startswith("engine_step ")]
    assert steps and {s.attributes["pegainfer.step.phase"] for s in steps} >= {"prefill", "decode"}
    span_of = {(r.trace_id, r.span_id): rid for rid, r in roots(spans).items()}
    for s in steps:
        a = s.attributes
        assert s.name == f"engine_step {a['pegainfer.step.phase']}" and s.parent_span_id == ""
        for key in ("pegainfer.step.rows", "pegainfer.step.decode_rows", "pegainfer.step.prefill_tokens",
                    "pegainfer.step.positions_max", "pegainfer.step.routes_per_rank",
                    "pegainfer.step.routes_per_expert",
                    "pegainfer.step.collective_calls", "pegainfer.step.collective_bytes", "pegainfer.step.exchange_s",
                    "pegainfer.step.cpu_s", "pegainfer.step.kv_slots_used", "pegainfer.backend",
                    "pegainfer.backend_maturity"):
            assert key in a, key
        # rows: one per request served, plus rows launched ahead for a request that had just ended
        assert a["pegainfer.step.rows"] == len(a["pegainfer.step.request_ids"]) + a["pegainfer.step.dropped_rows"]
        assert sum(a["pegainfer.step.routes_per_rank"]) == sum(a["pegainfer.step.routes_per_expert"]) > 0
        linked = sorted(span_of[(t, sid)] for t, sid, _ in s.links)
        assert linked == sorted(a["pegainfer.step.request_ids"]), "every request in the step is linked"
    # the batch of four shared decode steps, two at a time
    shared = [s for s in steps if s.attributes["pegainfer.step.decode_rows"] == 2]
    assert shared
    # each request of the length-8 run took part in 8 steps (one prefill, seven decode)
    rid = daemon_run.ids["length"]
    assert sum(rid in s.attributes["pegainfer.step.request_ids"] for s in steps) == 8


def test_file_is_valid_otlp_json_and_flushed_on_sigterm(daemon_run, spans):
    total = sum(check_line(line) for line in daemon_run.lines())
    assert total == len(spans) > 0
    final = roots(spans)[daemon_run.ids["final"]]
    assert len(children(spans, final)) == 3
    assert "telemetry shutdown with" not in daemon_run.log


def test_debug_traces_serves_the_same_otlp_json(daemon_run):
    lines = [json.loads(x) for x in daemon_run.debug_traces.splitlines() if x.strip()]
    assert lines and sum(check_line(x) for x in lines) > 10
    names = {s["name"] for x in lines for rs in x["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]}
    assert {"queue", "prefill", "decode", "engine_step decode"} <= names
    resources = [{a["key"]: a["value"] for a in rs["resource"]["attributes"]} for x in lines for rs in x["resourceSpans"]]
    assert all(r["pegainfer.batch_invariant"] == {"boolValue": True} for r in resources)
