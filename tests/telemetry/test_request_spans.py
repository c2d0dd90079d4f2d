"""The hub against a real scheduler on a hand-driven clock, exporting to memory: span times come
from the request's timestamps exactly, each request ends in exactly one root span whatever its
path, a traceparent becomes the parent, and engine steps link the requests they batched."""
from __future__ import annotations

import dataclasses

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from pegainfer.daemon.protocol import parse_completion
from pegainfer.engine.contract import StepRecord
from pegainfer.lifecycle.rejection import NotReady, QueueFull
from pegainfer.lifecycle.scheduler import Scheduler
from pegainfer.telemetry.clock import EpochClock
from pegainfer.telemetry.hub import Telemetry
from pegainfer.telemetry.request_spans import output_hash
from pegainfer.telemetry.tracing import Tracing
from tests.lifecycle.fakes import FakeClock, FakeEngine, make_request, tok

WALL = 1_700_000_000 * 10**9  # the epoch time of monotonic 0 in these tests
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def epoch(mono_s: float) -> int:
    return round(mono_s * 1e9) + WALL


@dataclasses.dataclass
class Rig:
    telemetry: Telemetry
    scheduler: Scheduler
    clock: FakeClock
    exported: InMemorySpanExporter

    def spans(self) -> list[ReadableSpan]:
        return list(self.exported.get_finished_spans())

    def roots(self) -> dict[str, ReadableSpan]:
        out: dict[str, ReadableSpan] = {}
        for s in self.spans():
            if s.name.startswith("text_completion"):
                key = s.attributes.get("gen_ai.response.id", f"front-{s.context.span_id:x}")
                assert key not in out, f"two root spans for {key}"
                out[key] = s
        return out

    def children(self, root: ReadableSpan) -> dict[str, ReadableSpan]:
        return {s.name: s for s in self.spans() if s.parent is not None and s.parent.span_id == root.context.span_id}

    def step(self, n: int, ids: list[str], phase: str = "decode") -> None:
        self.telemetry.on_step(StepRecord(
            step=n, phase=phase, request_ids=ids, rows=len(ids), decode_rows=len(ids) if phase == "decode" else 0,
            prefill_tokens=0 if phase == "decode" else 3 * len(ids), positions_max=3 + n,
            started_ns=epoch(self.clock.now) - 5_000_000, cpu_s=0.004, gpu_s=None, routes_per_rank=[6 * len(ids)],
            routes_per_expert=[3 * len(ids), 3 * len(ids)], collective_calls=0, collective_bytes=0, exchange_s=0.0,
            kv_slots_used=len(ids)))


@pytest.fixture
def rig() -> Rig:
    return make_rig()


def make_rig(step_trace_every: int = 1, max_active: int = 1, max_pending: int = 2) -> Rig:
    exported = InMemorySpanExporter()
    telemetry = Telemetry(Tracing(processors=[SimpleSpanProcessor(exported)]), step_trace_every=step_trace_every,
                          clock=EpochClock(wall_ns=WALL, monotonic_ns=0))
    telemetry.set_engine("local", "production", "deepseek-v2-lite")
    clock = FakeClock()
    scheduler = Scheduler(FakeEngine(), max_active=max_active, max_pending=max_pending, clock=clock, observer=telemetry)
    scheduler.set_ready(True)
    return Rig(telemetry, scheduler, clock, exported)


def test_a_finished_request_is_timed_from_its_timestamps(rig: Rig):
    body = {"prompt": "hi", "max_tokens": 3, "stream": True, "temperature": 0}
    parsed = parse_completion(body, max_tokens_default=16)
    rig.telemetry.on_request_start("r1", parsed, {"traceparent": f"00-{TRACE_ID}-{PARENT}-01"})
    request = make_request("r1", max_tokens=3)
    rig.scheduler.submit(request)  # received, pending and admitted at t=100
    rig.clock.tick(0.5)
    rig.scheduler.on_prefill_started("r1")  # 100.5
    rig.clock.tick(0.25)
    rig.scheduler.on_token(tok("r1", 7), 1)  # first token at 100.75
    rig.step(1, ["r1"], "prefill")
    for token in (8, 9):
        rig.clock.tick(0.125)
        rig.scheduler.on_token(tok("r1", token), 1)
    rig.scheduler.on_finished("r1", "length")  # 101.0
    rig.step(2, ["r1"])

    root = rig.roots()["r1"]
    assert root.kind is SpanKind.SERVER and root.name == "text_completion deepseek-v2-lite"
    assert (root.start_time, root.end_time) == (epoch(100.0), epoch(101.0))
    assert f"{root.context.trace_id:032x}" == TRACE_ID and f"{root.parent.span_id:016x}" == PARENT
    kids = rig.children(root)
    assert {k: (v.start_time, v.end_time) for k, v in kids.items()} == {
        "queue": (epoch(100.0), epoch(100.0)), "prefill": (epoch(100.5), epoch(100.75)),
        "decode": (epoch(100.75), epoch(101.0))}
    assert [(e.name, e.timestamp) for e in root.events] == [("first_token", epoch(100.75)), ("terminal", epoch(101.0))]
    a = root.attributes
    assert a["gen_ai.request.temperature"] == 0.0 and a["gen_ai.request.stream"] is True
    assert a["gen_ai.request.max_tokens"] == 3 and a["gen_ai.usage.input_tokens"] == 3
    assert a["gen_ai.usage.output_tokens"] == 3 and tuple(a["gen_ai.response.finish_reasons"]) == ("length",)
    assert a["pegainfer.terminal_reason"] == "completed_length"
    assert a["pegainfer.output_hash"] == output_hash([7, 8, 9])
    assert (a["pegainfer.ttft_s"], a["pegainfer.queue_s"], a["pegainfer.prefill_s"], a["pegainfer.decode_s"]) == (
        0.75, 0.0, 0.25, 0.25)
    assert root.status.status_code is StatusCode.UNSET


def test_a_sampled_request_carries_its_sampling_attributes(rig: Rig):
    from pegainfer.lifecycle.request import Request
    from pegainfer.lifecycle.sink import TokenSink

    body = {"prompt": "hi", "max_tokens": 2, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 5,
            "presence_penalty": 0.5, "frequency_penalty": -0.25, "stop": ["\n", "END"], "n": 2, "best_of": 3,
            "logprobs": 1}
    parsed = parse_completion(body, max_tokens_default=16)
    rig.telemetry.on_request_start("s1", parsed, {})
    rig.scheduler.submit(Request(parsed.admit("s1", [1, 2]), "m", TokenSink(64)))
    rig.scheduler.on_token(tok("s1", 7), 1)
    rig.scheduler.on_finished("s1", "stop")
    a = rig.roots()["s1"].attributes
    assert (a["gen_ai.request.temperature"], a["gen_ai.request.top_p"], a["gen_ai.request.top_k"]) == (0.7, 0.9, 40)
    assert a["gen_ai.request.seed"] == 5 and a["gen_ai.request.choice.count"] == 2
    assert (a["gen_ai.request.presence_penalty"], a["gen_ai.request.frequency_penalty"]) == (0.5, -0.25)
    assert tuple(a["gen_ai.request.stop_sequences"]) == ("\n", "END")
    assert a["pegainfer.request.best_of"] == 3 and a["pegainfer.request.logprobs"] == 1


def test_a_request_cancelled_in_the_queue_has_a_queue_span_cut_at_its_end(rig: Rig):
    rig.scheduler.submit(make_request("a"))
    rig.scheduler.submit(make_request("b"))  # waits: one slot
    rig.clock.tick(2.0)
    rig.scheduler.cancel("b")
    root = rig.roots()["b"]
    assert root.attributes["pegainfer.terminal_reason"] == "cancelled"
    kids = rig.children(root)
    assert list(kids) == ["queue"] and (kids["queue"].start_time, kids["queue"].end_time) == (epoch(100), epoch(102))
    assert [e.name for e in root.events] == ["terminal"] and "error.type" not in root.attributes


def test_scheduler_refusals_carry_their_http_status(rig: Rig):
    rig.scheduler.submit(make_request("a"))
    rig.scheduler.submit(make_request("b"))
    rig.scheduler.submit(make_request("c"))
    with pytest.raises(QueueFull):
        rig.scheduler.submit(make_request("d"))
    rig.scheduler.reject(make_request("e"), "prompt too long")
    roots = rig.roots()
    assert roots["d"].attributes["http.response.status_code"] == 429
    assert roots["d"].attributes["error.type"] == "queue_full" and roots["d"].status.status_code is StatusCode.ERROR
    assert roots["e"].attributes["http.response.status_code"] == 400
    assert roots["e"].attributes["error.type"] == "invalid_request"
    assert rig.children(roots["d"]) == {} and roots["e"].start_time == roots["e"].end_time


def test_a_refusal_after_the_engine_died_is_a_503_that_says_why(rig: Rig):
    rig.scheduler.fail_all("engine failed: RankFailure: expert rank 1 exited (killed by SIGKILL) while idle")
    with pytest.raises(NotReady):
        rig.scheduler.submit(make_request("late"))
    late = rig.roots()["late"]
    assert late.attributes["http.response.status_code"] == 503 and late.attributes["error.type"] == "not_ready"
    assert "expert rank 1" in late.attributes["pegainfer.error"]


def test_front_rejection_and_an_unsampled_caller_still_get_their_record(rig: Rig):
    rig.telemetry.on_front_rejection(401, "invalid API key", {"Traceparent": f"00-{TRACE_ID}-{PARENT}-00"})
    (root,) = rig.roots().values()
    assert root.context.trace_flags.sampled and f"{root.context.trace_id:032x}" == TRACE_ID
    assert root.attributes["pegainfer.terminal_reason"] == "rejected"
    assert root.attributes["error.type"] == "401" and root.attributes["http.response.status_code"] == 401
    rig.telemetry.on_front_rejection(400, "bad JSON", {"traceparent": "00-not-a-valid-header"})
    (fresh,) = [s for s in rig.roots().values() if s is not root and s.context.span_id != root.context.span_id]
    assert fresh.parent is None and f"{fresh.context.trace_id:032x}" != TRACE_ID


def test_failures_and_engine_death_end_every_request_once(rig: Rig):
    rig.scheduler.submit(make_request("a"))
    rig.scheduler.submit(make_request("b"))
    rig.scheduler.on_token(tok("a", 1), 1)
    rig.scheduler.fail_all("engine failed: boom")
    rig.telemetry.on_engine_died("boom")
    roots = rig.roots()
    assert {k: v.attributes["pegainfer.terminal_reason"] for k, v in roots.items()} == {"a": "failed", "b": "failed"}
    assert roots["a"].attributes["error.type"] == "engine_failed"
    assert roots["a"].status.description == "engine failed: boom"
    assert set(rig.children(roots["a"])) == {"queue", "prefill", "decode"}
    assert set(rig.children(roots["b"])) == {"queue"}
    assert rig.telemetry.requests.live_count == 0


def test_steps_link_their_requests_including_one_that_ended_in_that_step():
    rig = make_rig(max_active=2)
    for rid in ("a", "b"):
        rig.scheduler.submit(make_request(rid, max_tokens=1))
    rig.scheduler.on_token(tok("a", 1), 2)
    rig.scheduler.on_token(tok("b", 1), 2)
    rig.scheduler.on_finished("a", "length")  # a ends in the step whose record comes next
    rig.step(1, ["a", "b"], "prefill")
    (step,) = [s for s in rig.spans() if s.name == "engine_step prefill"]
    roots = rig.roots()
    (b_link,) = rig.telemetry.requests.links(["b"])  # b is still running: its span is open
    assert [link.context.span_id for link in step.links] == [roots["a"].context.span_id, b_link.context.span_id]
    assert [link.attributes["pegainfer.request_id"] for link in step.links] == ["a", "b"]
    assert step.parent is None and step.kind is SpanKind.INTERNAL
    assert step.attributes["pegainfer.step.request_ids"] == ("a", "b") and "pegainfer.step.gpu_s" not in step.attributes
    assert step.end_time - step.start_time == 4_000_000
    rig.step(2, ["b"])
    assert [link.attributes["pegainfer.request_id"] for link in rig.spans()[-1].links] == ["b"]  # a is gone


@pytest.mark.parametrize(("every", "traced"), [(0, []), (1, [1, 2, 3, 4]), (2, [2, 4])])
def test_step_sampling(every: int, traced: list[int]):
    rig = make_rig(step_trace_every=every)
    for n in range(1, 5):
        rig.step(n, [])
    assert [s.attributes["pegainfer.step.index"] for s in rig.spans()] == traced


def test_a_telemetry_bug_is_counted_and_never_fails_the_request(rig: Rig, monkeypatch, caplog):
    def broken(*args):
        raise RuntimeError("bug")

    monkeypatch.setattr(rig.telemetry.requests, "on_transition", broken)
    request = make_request("a", max_tokens=1)
    rig.scheduler.submit(request)
    rig.scheduler.on_token(tok("a", 1), 1)
    rig.scheduler.on_finished("a", "length")
    assert request.terminal_reason is not None and request.terminal_reason.value == "completed_length"
    assert rig.telemetry.errors == 5  # PENDING, ADMITTED, PREFILL, DECODE, FINISHED
    assert "telemetry: on_transition failed" in caplog.text


def test_a_preemption_is_an_event_on_the_requests_span_and_counted(rig: Rig):
    request = make_request("p", max_tokens=3)
    rig.scheduler.submit(request)
    rig.scheduler.on_prefill_started("p", 64)  # 64 prompt tokens from the prefix cache
    rig.scheduler.on_token(tok("p", 7), 1)
    rig.clock.tick(0.25)
    rig.telemetry.on_preempted("p", 0)  # its pages freed: it will be recomputed
    rig.telemetry.on_preempted("gone", 0)  # a request with no live span: nothing to mark, no error
    rig.telemetry.on_preempted("p", 0)
    for token in (8, 9):
        rig.scheduler.on_token(tok("p", token), 1)
    rig.scheduler.on_finished("p", "length")
    root = rig.roots()["p"]
    events = [e for e in root.events if e.name == "preempted"]
    assert [e.attributes["pegainfer.preemptions"] for e in events] == [1, 2]
    assert events[0].attributes["pegainfer.choice"] == 0
    assert root.attributes["pegainfer.preemptions"] == 2
    assert request.cached_tokens == 64
    assert rig.telemetry.metrics.preemptions.total() == 3
