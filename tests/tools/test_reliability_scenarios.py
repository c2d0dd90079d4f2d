"""Scenario-level rules of the reliability runner, fed crafted facts: the expert-rank failure must
fail in time with an explicit message, /ready 503 and a non-zero exit; an idle rank's death or stall
must turn /ready 503 within its bound (a stall not before the rank timeout either), the request
after it must be refused with 503 naming the rank, and the daemon must exit non-zero; the drain must exit 0; the
overload burst must see a 429 and lose nothing; a scenario with one failed check fails, and the
run's exit status follows. Also the trace-file reader and the expert-rank discovery via /proc."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tests.tools.test_reliability_fakes import done, index, span
from tools.reliakit import observation as o
from tools.reliakit.check import Check
from tools.reliakit.daemon import child_pids, cmdline
from tools.reliakit.dry_run import dry_record
from tools.reliakit.limits import Limits
from tools.reliakit.observation import Expectation, completes, refused
from tools.reliakit.result import ScenarioRun
from tools.reliakit.run_record import RunRecord
from tools.reliakit.scenarios import (
    SCENARIOS,
    double_sigterm,
    drain,
    expert_rank_failure,
    idle_rank_death,
    idle_rank_stall,
    overload_active_cap,
)
from tools.reliakit.server_spans import read

LIMITS = Limits("tiny", "host-staged", "production", 2, 2, 2, 512)
FAILED = Expectation(o.ERROR_CHUNK, ("failed",), error_code="engine_failed")
GOOD_KILL = {"kill_s": 10.0, "first_503_s": 10.2, "exit_code": 1}


def in_flight(end_s: float = 10.1, message: str = "expert rank 1 failed; the engine stopped while running this request"
              ) -> o.RequestObservation:
    x = done("in_flight_0", FAILED)
    x.end_s = end_s
    x.error["message"] = message
    return x


def failing(checks: list[Check]) -> set[str]:
    return {c.name for c in checks if c.failed}


def test_expert_rank_failure_rules():
    assert failing(expert_rank_failure.checks([in_flight()], GOOD_KILL, LIMITS)) == set()
    assert failing(expert_rank_failure.checks([in_flight(end_s=30.0)], GOOD_KILL, LIMITS)) == {"failed_within_bound"}
    assert failing(expert_rank_failure.checks([in_flight(message="something went wrong")], GOOD_KILL, LIMITS)) == \
        {"failure_message_explicit"}
    leaky = "RankFailure: expert rank 1 exited [../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:61835"
    assert failing(expert_rank_failure.checks([in_flight(message=leaky)], GOOD_KILL, LIMITS)) == \
        {"failure_message_explicit"}
    hung = done("in_flight_0", FAILED, outcome=o.TIMED_OUT)
    assert "failed_within_bound" in failing(expert_rank_failure.checks([hung], GOOD_KILL, LIMITS))
    assert failing(expert_rank_failure.checks([in_flight()], {**GOOD_KILL, "first_503_s": None}, LIMITS)) == \
        {"ready_503_after_failure"}
    assert failing(expert_rank_failure.checks([in_flight()], {**GOOD_KILL, "exit_code": 0}, LIMITS)) == \
        {"exit_status_nonzero"}
    assert failing(expert_rank_failure.checks([in_flight()], {**GOOD_KILL, "exit_code": None}, LIMITS)) == \
        {"exit_status_nonzero"}  # still running: a hang


NAMED = "server not ready: expert rank 1 failed"


def _after_failure(status: int = 503, outcome: str = o.HTTP_ERROR, message: str = NAMED) -> o.RequestObservation:
    x = done("after_failure", refused(503, "not_ready", retry_after=True), status=status, outcome=outcome)
    x.error["message"] = message
    return x


def _idle_facts(after: float, **extra) -> dict:
    return {"idle_at_signal": True, "signal_s": 10.0, "ready_503_s": 10.0 + after, "ready_503_after_s": after,
            "exit_code": 1, "exit_s": 12.0 + after, "exit_after_s": 2.0 + after, **extra}


def test_idle_rank_death_rules():
    rules = idle_rank_death.SCENARIO.checks
    assert failing(rules([_after_failure()], _idle_facts(0.3), LIMITS)) == set()
    assert failing(rules([_after_failure()], _idle_facts(1.4), LIMITS)) == {"ready_503_within_bound"}
    assert failing(rules([_after_failure()], _idle_facts(0.3, ready_503_after_s=None, ready_503_s=None), LIMITS)) == \
        {"ready_503_within_bound"}  # /ready never turned 503
    accepted_then_failed = _after_failure(status=200, outcome=o.ERROR_CHUNK)
    assert failing(rules([accepted_then_failed], _idle_facts(0.3), LIMITS)) == {"refused_after_failure"}
    assert failing(rules([_after_failure(message="server not ready")], _idle_facts(0.3), LIMITS)) == \
        {"failure_message_explicit"}
    leaky = "server not ready: engine failed: RankFailure: expert rank 1 exited [127.0.0.1]:61835"
    assert failing(rules([_after_failure(message=leaky)], _idle_facts(0.3), LIMITS)) == {"failure_message_explicit"}
    assert failing(rules([_after_failure()], _idle_facts(0.3, idle_at_signal=False), LIMITS)) == {"idle_at_signal"}
    assert failing(rules([_after_failure()], _idle_facts(0.3, exit_code=0), LIMITS)) == {"exit_status_nonzero"}
    assert failing(rules([_after_failure()], _idle_facts(0.3, exit_code=None), LIMITS)) == {"exit_status_nonzero"}
    assert failing(rules([_after_failure()], _idle_facts(0.3, exit_s=40.0), LIMITS)) == {"exit_status_nonzero"}


def test_idle_rank_stall_rules_bound_the_503_on_both_sides():
    rules, timeout = idle_rank_stall.SCENARIO.checks, idle_rank_stall.idle_rank.RANK_TIMEOUT_S
    assert failing(rules([_after_failure()], _idle_facts(timeout + 0.2), LIMITS)) == set()
    assert failing(rules([_after_failure()], _idle_facts(timeout + 0.7), LIMITS)) == {"ready_503_within_bound"}
    assert failing(rules([_after_failure()], _idle_facts(1.0), LIMITS)) == {"ready_503_within_bound"}  # too early


def test_drain_rules():
    good = {"ready_status_while_draining": 503, "exit_code": 0}
    assert failing(drain.checks([], good, LIMITS)) == set()
    assert failing(drain.checks([], {**good, "exit_code": 1}, LIMITS)) == {"exit_status_zero"}
    assert failing(drain.checks([], {**good, "exit_code": None}, LIMITS)) == {"exit_status_zero"}
    assert failing(drain.checks([], {**good, "ready_status_while_draining": 200}, LIMITS)) == \
        {"ready_503_while_draining"}


def test_double_sigterm_rules():
    shut = Expectation(o.ERROR_CHUNK, ("cancelled",), error_code="server_shutdown")

    def stream(i: int, outcome: str = o.ERROR_CHUNK, code: str = "server_shutdown", done_: bool = True,
               end_s: float = 10.5) -> o.RequestObservation:
        x = done(f"stream_{i}", shut, outcome=outcome)
        x.error = {"message": "server shutting down (forced stop)", "type": "service_unavailable", "param": None,
                   "code": code} if outcome == o.ERROR_CHUNK else None
        x.done, x.end_s = done_, end_s
        return x

    good = {"second_sigterm_s": 10.0, "running_at_second_sigterm": 2, "exit_code": 3}
    assert failing(double_sigterm.checks([stream(0), stream(1)], good, LIMITS)) == set()
    finished_first = done("stream_1", completes(8))
    assert failing(double_sigterm.checks([stream(0), finished_first], good, LIMITS)) == set()
    assert failing(double_sigterm.checks([stream(0), stream(1, outcome=o.INCOMPLETE)], good, LIMITS)) == \
        {"none_cut_silently"}  # cut off without an error chunk
    assert failing(double_sigterm.checks([stream(0), stream(1, done_=False)], good, LIMITS)) == {"none_cut_silently"}
    assert failing(double_sigterm.checks([stream(0), stream(1, code="request_cancelled")], good, LIMITS)) == \
        {"none_cut_silently"}
    assert failing(double_sigterm.checks([stream(0), stream(1, end_s=25.0)], good, LIMITS)) == {"none_cut_silently"}
    assert failing(double_sigterm.checks([finished_first], {**good, "running_at_second_sigterm": 0}, LIMITS)) == \
        {"forced_stop_tested"}
    assert failing(double_sigterm.checks([stream(0)], {**good, "exit_code": 0}, LIMITS)) == {"exit_status_nonzero"}
    assert failing(double_sigterm.checks([stream(0)], {**good, "exit_code": None}, LIMITS)) == {"exit_status_nonzero"}


def test_overload_rules():
    def burst(i: int, status: int, tokens: int | None = 24):
        x = done(f"burst_{i}", completes(24), status=status, tokens=tokens,
                 outcome=o.COMPLETED if status == 200 else o.HTTP_ERROR)
        x.max_tokens = 24
        return x

    assert failing(overload_active_cap.checks([burst(0, 200), burst(1, 429)], {}, LIMITS)) == set()
    assert failing(overload_active_cap.checks([burst(0, 200), burst(1, 200)], {}, LIMITS)) == {"queue_full_seen"}
    lost = burst(0, 200, tokens=20)
    assert failing(overload_active_cap.checks([lost, burst(1, 429)], {}, LIMITS)) == {"nothing_lost"}
    queued = done("queue_0", completes(24), status=429, outcome=o.HTTP_ERROR)
    assert "nothing_lost" in failing(overload_active_cap.checks([queued, burst(1, 429)], {}, LIMITS))


def test_one_failed_check_fails_the_scenario_and_the_run():
    rec = dry_record(list(SCENARIOS.values()), "host-staged", 2, spawn=True)
    assert rec.exit_code == 0 and not rec.failed
    run = rec.scenarios[1]
    run.checks.append(Check("something", "fail", "broken"))
    run.status = "failed"
    assert rec.exit_code == 1 and run.name in rec.failed
    rec = dry_record(list(SCENARIOS.values()), "local", 1, spawn=True)
    rec.run_checks.append(Check("final_idle", "fail", "kv_slots_free 3 of 4"))
    assert rec.exit_code == 1 and "run:final_idle" in rec.failed
    assert RunRecord(baseline=rec.baseline, final=rec.final).exit_code == 1  # nothing ran: not a pass


def test_finalize_fails_a_scenario_whose_request_lost_its_span():
    scenario = SCENARIOS["invalid_requests"]
    run = ScenarioRun(scenario.name, scenario.description, limits=Limits("tiny", "local", "production", 1, 2, 2, 512))
    x = done("bad_json", refused(400))
    base = done("baseline", completes(24), kind="follow_up")
    run.observations, run.follow_up = [x], done("follow_up", completes(24), kind="follow_up")
    run.finalize(scenario, base, index(span(base), span(run.follow_up)))  # no span for bad_json
    assert run.status == "failed"
    assert {c.name for c in run.checks if c.failed} == {"trace_coverage", "terminal_reasons"}


def otlp_line(trace_id: str, name: str, attrs: dict) -> str:
    def value(v):
        return {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}

    span_ = {"traceId": trace_id, "spanId": "ab" * 8, "parentSpanId": "cd" * 8, "name": name, "kind": 2,
             "startTimeUnixNano": "1", "endTimeUnixNano": "2",
             "attributes": [{"key": k, "value": value(v)} for k, v in attrs.items()]}
    return json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {}, "spans": [span_]}]}]})


def test_trace_reader_indexes_request_roots_and_skips_a_torn_line(tmp_path):
    root = {"gen_ai.operation.name": "text_completion", "pegainfer.terminal_reason": "rejected",
            "http.response.status_code": 400}
    lines = [otlp_line("1" * 32, "text_completion tiny", root),
             otlp_line("1" * 32, "queue", {"gen_ai.operation.name": "x"}),  # a child: not a root
             otlp_line("2" * 32, "engine_step decode", {"pegainfer.step.index": 3})]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n" + otlp_line("3" * 32, "text_completion tiny", root)[:50])
    spans = read([path, tmp_path / "missing.jsonl"])
    assert list(spans) == ["1" * 32]
    assert spans["1" * 32][0].reason == "rejected" and spans["1" * 32][0].joined()["http_status"] == 400


def test_expert_ranks_are_found_among_child_processes():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in child_pids(os.getpid())
        deadline = time.monotonic() + 10  # /proc/PID/cmdline is empty for a moment while exec runs
        while not cmdline(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "time.sleep(30)" in cmdline(child.pid)
    finally:
        child.kill()
        child.wait()


def test_the_overload_burst_holds_the_server_longer_than_the_queue_part():
    """The burst's requests outlast the time a client takes to send them all (a fast device ended 24
    tokens before the last of 99 arrived, and no 429 came), within the server's context."""
    planned = overload_active_cap.plan(LIMITS)
    room = LIMITS.max_active + LIMITS.max_pending
    queue, burst = planned[:room], planned[room:]
    assert {x.max_tokens for x in queue} == {overload_active_cap.TOKENS}
    assert {x.max_tokens for x in burst} == {min(overload_active_cap.BURST_TOKENS, LIMITS.max_model_len - 64)}
    assert all(x.max_tokens > overload_active_cap.TOKENS for x in burst)
