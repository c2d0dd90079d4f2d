"""The reliability runner's strict rules fail when they should: each test feeds the check functions
crafted observations and spans that a correct server would produce (they pass), then breaks one
thing (a disconnect the server calls completed, a span missing a field, hash drift, a leaked slot,
a missing or duplicated terminal span, ...) and the rule named for it must fail."""
from __future__ import annotations

import dataclasses

import pytest

from tests.tools.test_reliability_fakes import done, good_mix, index, span
from tools.reliakit import observation as o
from tools.reliakit import request_checks as rc
from tools.reliakit import server_checks as sc
from tools.reliakit.observation import Expectation, completes, refused


def spans_for(observations, **by_label):
    """A correct span per observation; by_label replaces one label's span (None: no span)."""
    out = []
    for x in observations:
        s = by_label.get(x.label, span(x))
        if s is not None:
            out += s if isinstance(s, list) else [s]
    return index(*out)


ALL_REQUEST_RULES = (rc.trace_coverage, rc.trace_fields, rc.terminal_reasons, rc.hash_stability)


def test_good_inputs_pass_every_rule():
    xs = good_mix()
    spans = spans_for(xs)
    for rule in ALL_REQUEST_RULES:
        assert rule(xs, spans).status == "pass", rule(xs, spans).detail
    assert rc.client_outcomes(xs).status == "pass", rc.client_outcomes(xs).detail
    assert rc.timeouts(xs).status == "pass"
    assert rc.trace_fields(xs, spans, "local", "production").status == "pass"


def test_disconnect_without_the_matching_server_reason_fails():
    xs = good_mix()
    closed = next(x for x in xs if x.label == "closed")
    check = rc.terminal_reasons(xs, spans_for(xs, closed=span(closed, "completed_length")))
    assert check.status == "fail"
    assert "closed: server terminal reason completed_length, expected disconnected" in check.detail
    # cancelled and disconnected are told apart: a cancel the server calls a disconnect fails too
    cancelled = next(x for x in xs if x.label == "cancelled")
    assert rc.terminal_reasons(xs, spans_for(xs, cancelled=span(cancelled, "disconnected"))).status == "fail"


@pytest.mark.parametrize("label, field", [("a", "pegainfer.output_hash"), ("a", "pegainfer.active_set_size_max"),
                                          ("a", "pegainfer.decode_batch_size_max"),
                                          ("closed", "pegainfer.pending_depth_at_admit"),
                                          ("busy", "http.response.status_code"), ("bad_json", "pegainfer.backend")])
def test_a_span_missing_a_field_fails(label, field):
    xs = good_mix()
    x = next(x for x in xs if x.label == label)
    check = rc.trace_fields(xs, spans_for(xs, **{label: span(x, drop=(field,))}))
    assert check.status == "fail" and field in check.detail and label in check.detail


def test_span_fields_must_agree_with_the_server():
    xs = good_mix()
    a = xs[0]
    assert rc.trace_fields(xs, spans_for(xs, a=span(a, **{"pegainfer.output_hash": "xyz"}))).status == "fail"
    assert rc.trace_fields(xs, spans_for(xs), backend="host-staged").status == "fail"
    assert rc.trace_fields(xs, spans_for(xs, a=span(a, "finished_somehow"))).status == "fail"


def test_hash_drift_within_one_kind_fails():
    xs = good_mix()
    xs[1] = done("b", completes(8), kind="k8", text="different")
    check = rc.hash_stability(xs, spans_for(xs))
    assert check.status == "fail" and "k8: 2 different streamed texts" in check.detail
    # same streamed text, but the server's output hash drifts
    xs = good_mix()
    check = rc.hash_stability(xs, spans_for(xs, b=span(xs[1], **{"pegainfer.output_hash": "f" * 64})))
    assert check.status == "fail" and "k8: 2 different server output hashes" in check.detail


def test_drift_is_judged_only_over_requests_that_completed_in_full():
    xs = good_mix()
    xs[1] = done("b", completes(8), kind="k8", text="cut short", tokens=5)  # fails client_outcomes instead
    assert rc.hash_stability(xs, spans_for(xs)).status == "pass"
    assert rc.client_outcomes(xs).status == "fail"


@pytest.mark.parametrize("label", ["a", "closed", "cancelled", "bad_json", "busy"])
def test_a_missing_terminal_span_fails(label):
    xs = good_mix()
    check = rc.trace_coverage(xs, spans_for(xs, **{label: None}))
    assert check.status == "fail" and f"{label}: no terminal request span" in check.detail


def test_a_span_without_a_terminal_reason_is_missing_and_two_spans_fail():
    xs = good_mix()
    a = xs[0]
    assert rc.trace_coverage(xs, spans_for(xs, a=span(a, drop=("pegainfer.terminal_reason",)))).status == "fail"
    check = rc.trace_coverage(xs, spans_for(xs, a=[span(a), span(a)]))
    assert check.status == "fail" and "a: 2 terminal request spans" in check.detail


def test_a_refusal_needs_a_rejected_span_with_its_status_and_ids_must_match():
    xs = good_mix()
    busy = next(x for x in xs if x.label == "busy")
    assert rc.trace_coverage(xs, spans_for(xs, busy=span(busy, **{"http.response.status_code": 503}))).status == "fail"
    assert rc.trace_coverage(xs, spans_for(xs, busy=span(busy, "completed_length"))).status == "fail"
    a = xs[0]
    assert rc.trace_coverage(xs, spans_for(xs, a=span(a, **{"gen_ai.response.id": "cmpl-other"}))).status == "fail"


def test_without_a_trace_file_trace_rules_skip_not_pass():
    xs = good_mix()
    for rule in (rc.trace_coverage, rc.trace_fields, rc.terminal_reasons):
        assert rule(xs, None).status == "skip"


@pytest.mark.parametrize("broken, words", [
    (lambda: done("x", refused(429, "queue_full", retry_after=True), retry_after=""), "Retry-After"),
    (lambda: done("x", completes(8), tokens=7), "7 completion tokens, expected 8"),
    (lambda: done("x", refused(400), status=200, outcome=o.COMPLETED), "outcome completed"),
    (lambda: done("x", refused(404, "model_not_found"), code="not_found"), "error code"),
    (lambda: done("x", Expectation(o.CLOSED, ("disconnected",)), outcome=o.INCOMPLETE), "outcome incomplete"),
])
def test_client_outcome_rule_fails_on_each_deviation(broken, words):
    check = rc.client_outcomes([broken()])
    assert check.status == "fail" and words in check.detail


def test_error_shape_is_exact():
    good = {"error": {"message": "m", "type": "t", "param": None, "code": None}}
    assert rc.error_shape_problem(good) is None
    assert rc.error_shape_problem({"error": {"message": "m", "type": "t", "code": None}})  # no param
    assert rc.error_shape_problem({"error": {"message": "", "type": "t", "param": None, "code": None}})
    assert rc.error_shape_problem({"detail": "Not Found"})
    x = done("x", refused(400))
    x.error_body = {"error": "just a string"}
    assert rc.client_outcomes([x]).status == "fail"


def test_an_error_chunk_without_done_fails():
    x = done("x", Expectation(o.ERROR_CHUNK, ("failed",), error_code="engine_failed"))
    x.done = False
    assert "no data: [DONE]" in rc.client_outcomes([x]).detail


def test_an_unexplained_timeout_fails():
    xs = good_mix()
    xs[0].outcome, xs[0].note = o.TIMED_OUT, "no end within 60 s"
    check = rc.timeouts(xs)
    assert check.status == "fail" and "a: no end within 60 s" in check.detail


def test_overload_expectation_is_chosen_by_status():
    x = done("burst", completes(8), status=429, outcome=o.HTTP_ERROR, tokens=None, retry_after="1")
    x.expect.either = refused(429, "queue_full", retry_after=True)
    x.error["code"] = "queue_full"
    assert rc.client_outcomes([x]).status == "pass"
    x.status = 503  # neither alternative
    assert rc.client_outcomes([x]).status == "fail"


IDLE = {"scheduler": {"running": 0, "waiting": 0}, "engine": {"running": 0, "waiting": 0},
        "kv_slots_free": 4, "kv_slots_total": 4, "kv_pages": {"free": 60, "in_use": 0, "total": 60}}


@pytest.mark.parametrize("status, change, words", [
    (200, {"kv_slots_free": 3}, "kv_slots_free 3 of 4"),
    (200, {"kv_pages": {"free": 58, "in_use": 2, "total": 60}}, "kv_pages in_use 2 of 60"),
    (200, {"scheduler": {"running": 1, "waiting": 0}}, "scheduler.running = 1"),
    (200, {"engine": {"running": 0, "waiting": 2}}, "engine.waiting = 2"),
    (503, {}, "/ready answered 503"),
    (None, {}, "answered nothing"),
])
def test_a_leaked_slot_fails_the_idle_rule(status, change, words):
    assert sc.idle("final_idle", 200, IDLE).status == "pass"
    check = sc.idle("final_idle", status, {**IDLE, **change})
    assert check.status == "fail" and words in check.detail


def test_follow_up_must_reproduce_the_baseline():
    base = done("baseline", completes(24), kind="follow_up")
    same = done("follow_up", completes(24), kind="follow_up")
    spans = index(span(base), span(same))
    assert sc.follow_up(base, same, spans).status == "pass"
    drifted = done("follow_up", completes(24), kind="follow_up", text="other")
    assert "differs from the baseline" in sc.follow_up(base, drifted, index(span(base), span(drifted))).detail
    assert sc.follow_up(base, same, index(span(base), span(same, **{"pegainfer.output_hash": "0" * 64}))).failed
    failed = done("follow_up", completes(24), kind="follow_up", outcome=o.CONNECTION_ERROR)
    assert sc.follow_up(base, failed, spans).failed
    assert sc.follow_up(base, same, index(span(base))).failed  # the follow-up has no span


@pytest.mark.parametrize("seen, at_least, at_most, ok", [
    ({"trace": 2, "ready": 2}, 2, 2, True),
    ({"trace": 1, "ready": None}, 1, None, True),
    ({"trace": None, "ready": 3}, 1, 4, True),
    ({"trace": 0, "ready": 0}, 1, None, False),  # no pending-queue evidence
    ({"trace": None, "ready": None}, 1, None, False),
    ({"trace": 3, "ready": 2}, 2, 2, False),  # the active set went past its cap
])
def test_scheduler_evidence(seen, at_least, at_most, ok):
    assert (sc.evidence("pending_queue", seen, at_least=at_least, at_most=at_most).status == "pass") is ok


def test_maxima_come_from_the_trace_and_ready():
    xs = good_mix()
    a = xs[0]
    spans = spans_for(xs, a=span(a, **{"pegainfer.pending_depth_at_admit": 3, "pegainfer.queue_s": 0.5}))
    m = sc.maxima(xs, spans, {"running_max": 2, "waiting_max": 1, "decode_batch_max": 4})
    assert m["pending_queue"] == {"trace": 3, "ready": 1, "trace_requests_queued": 1}
    assert m["active_set"] == {"trace": 2, "ready": 2} and m["decode_batch"] == {"trace": 2, "ready": 4}


def test_expectations_round_trip_into_the_artifact():
    e = dataclasses.replace(completes(8), either=refused(429, "queue_full", retry_after=True))
    d = e.to_dict()
    assert d["either"]["status"] == 429 and d["tokens"] == 8 and d["server_reasons"] == ["completed_length"]
