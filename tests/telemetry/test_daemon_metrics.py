"""End to end: /metrics of a real daemon moves as requests run, finish, fail and are refused; every
sample names the served model; vLLM's families are there; generation tokens are counted as they are
produced; /ready and /metrics count the same rejections."""
from __future__ import annotations

from tests.telemetry.prom import families, samples, total, value
from tests.telemetry.run import BATCH_TOKENS, LATER_CHUNKS, DaemonRun


def test_request_gauges_follow_the_scheduler(daemon_run: DaemonRun):
    assert value(daemon_run.metrics_before, "pegainfer:num_requests_running") == 0
    assert value(daemon_run.metrics_during, "pegainfer:num_requests_running") == 1
    assert value(daemon_run.metrics_during, "pegainfer:num_requests_waiting") == 0
    assert value(daemon_run.metrics_during, "pegainfer:kv_slots_used") == 1
    assert value(daemon_run.metrics_after, "pegainfer:num_requests_running") == 0
    assert value(daemon_run.metrics_after, "pegainfer:kv_slots_used") == 0
    assert value(daemon_run.metrics_after, "pegainfer:kv_slots_total") == 2


def test_terminal_totals_by_reason(daemon_run: DaemonRun):
    before, after = daemon_run.metrics_before, daemon_run.metrics_after
    name = "pegainfer:requests_terminal_total"
    assert all(value(before, name, terminal_reason=r) == 0 for r in
               ("completed_length", "completed_stop", "cancelled", "disconnected", "failed", "rejected"))
    assert value(after, name, terminal_reason="completed_length") == 6  # length, 4 batch; the final one is after
    assert value(after, name, terminal_reason="completed_stop") == 1
    assert value(after, name, terminal_reason="cancelled") == 1
    assert value(after, name, terminal_reason="disconnected") == 1
    assert value(after, name, terminal_reason="failed") == 1
    assert value(after, name, terminal_reason="rejected") == 2  # malformed JSON and over the context


def test_latency_histograms_and_token_counters_move(daemon_run: DaemonRun):
    before, during, after = daemon_run.metrics_before, daemon_run.metrics_during, daemon_run.metrics_after
    assert value(before, "pegainfer:time_to_first_token_seconds_count") == 0
    assert value(after, "pegainfer:time_to_first_token_seconds_count") == 10  # every request that got a token
    assert value(after, "pegainfer:e2e_request_latency_seconds_count") == 10
    assert value(after, "pegainfer:request_queue_time_seconds_count") == 10
    assert value(after, "pegainfer:request_queue_time_seconds_sum") > 0.005  # two of the batch waited
    itl_during = value(during, "pegainfer:inter_token_latency_seconds_count")
    assert 0 < itl_during < value(after, "pegainfer:inter_token_latency_seconds_count")
    assert value(after, "pegainfer:inter_token_latency_seconds_sum") > 0
    assert value(before, "pegainfer:generation_tokens_total") == 0
    assert value(after, "pegainfer:generation_tokens_total") >= 8 + 6 + sum(BATCH_TOKENS) + 3
    assert value(after, "pegainfer:prompt_tokens_total") > value(during, "pegainfer:prompt_tokens_total") > 0
    steps = sum(v for (n, _), v in samples(after).items() if n == "pegainfer:engine_step_duration_seconds_count")
    assert steps >= 8 + 6 + sum(BATCH_TOKENS) // 2  # the length and stop runs, then the batch two rows a step


def test_backend_info_and_dropped_spans(daemon_run: DaemonRun):
    after = daemon_run.metrics_after
    info = [labels for (n, labels), v in samples(after).items() if n == "pegainfer:backend_info" and v == 1]
    assert len(info) == 1
    labels = dict(info[0])
    assert labels["backend"] == "local" and labels["maturity"] == "production" and labels["model"].startswith("tiny")
    assert labels["batch_invariant"] == "true"
    assert value(after, "pegainfer:dropped_spans_total", exporter="file") == 0
    assert value(after, "pegainfer:telemetry_errors_total") == 0 and "telemetry:" not in daemon_run.log


def test_every_sample_carries_the_served_model_name_and_vllm_families_are_there(daemon_run: DaemonRun):
    from tests.telemetry.test_metrics import VLLM_FAMILIES
    after = daemon_run.metrics_after
    names = {dict(labels).get("model_name") for _, labels in samples(after)}
    assert len(names) == 1 and next(iter(names)).startswith("tiny")  # the served model name, on every sample
    fams = families(after)
    for suffix, (kind, _, _) in VLLM_FAMILIES.items():
        assert fams["pegainfer:" + suffix].type == kind, suffix
    assert total(after, "pegainfer:request_success_total") == value(after, "pegainfer:request_prompt_tokens_count")
    assert value(after, "pegainfer:request_success_total", finished_reason="length") == 6
    assert value(after, "pegainfer:request_success_total", finished_reason="stop") == 1
    assert value(after, "pegainfer:request_success_total", finished_reason="abort") == 2  # cancelled, disconnected
    assert value(after, "pegainfer:request_success_total", finished_reason="error") == 1
    assert 0 <= value(daemon_run.metrics_during, "pegainfer:kv_cache_usage_perc") <= 1
    # one running request's few KV pages of the 512 (the CPU default: 8 x 4096 tokens in pages of 64)
    assert 0 < value(daemon_run.metrics_during, "pegainfer:kv_cache_usage_perc") <= 0.05
    assert value(daemon_run.metrics_during, "pegainfer:kv_slots_used") == 1


def test_generation_tokens_grow_while_a_stream_runs(daemon_run: DaemonRun):
    during, later = daemon_run.metrics_during, daemon_run.metrics_later
    assert value(during, "pegainfer:num_requests_running") == value(later, "pegainfer:num_requests_running") == 1
    grown = value(later, "pegainfer:generation_tokens_total") - value(during, "pegainfer:generation_tokens_total")
    assert grown >= LATER_CHUNKS  # counted as produced, before the request ended
    assert value(later, "pegainfer:request_generation_tokens_count") == \
        value(during, "pegainfer:request_generation_tokens_count")  # the per-request histogram: only at the end


def test_rejections_agree_between_ready_and_metrics(daemon_run: DaemonRun):
    """The malformed JSON is refused at the front, the over-long prompt by the scheduler: /ready and
    /metrics give the same two numbers, and the terminal total is their sum."""
    after, ready = daemon_run.metrics_after, daemon_run.ready_after
    assert ready["rejected"] == {"front": 1, "scheduler": 1}
    assert ready["scheduler"]["rejected"] == ready["rejected"]["scheduler"]
    for stage, n in ready["rejected"].items():
        assert total(after, "pegainfer:requests_rejected_total", stage=stage) == n
    assert value(after, "pegainfer:requests_rejected_total", stage="scheduler", code="context_length_exceeded") == 1
    assert value(after, "pegainfer:requests_terminal_total", terminal_reason="rejected") == sum(ready["rejected"].values())
