"""The reliability runner end to end on CPU against the tiny model: --spawn with the local backend
(every scenario that applies), --spawn with host-staged at ep 2 (drain, the killed expert rank and
the idle rank death and stall included), and --url against a daemon started here (with and without its trace file)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.daemon_process import DaemonProcess
from tools import reliability
from tools.reliakit.scenarios import SCENARIOS

pytestmark = pytest.mark.slow


def run(tmp_path: Path, *args: str) -> tuple[int, dict]:
    out = tmp_path / "artifact.json"
    code = reliability.main([*args, "--out", str(out)])
    return code, json.loads(out.read_text())


def by_name(doc: dict) -> dict[str, dict]:
    return {s["name"]: s for s in doc["scenarios"]}


def failures(doc: dict) -> list[str]:
    """Every failed check, for the assertion message."""
    out = [f"run:{c['name']}: {c['detail']}" for c in doc["checks"] if c["status"] == "fail"]
    for s in doc["scenarios"]:
        out += [f"{s['name']}:{c['name']}: {c['detail']}" for c in s["checks"] if c["status"] == "fail"]
    return out


def assert_common(doc: dict) -> None:
    for s in doc["scenarios"]:
        if s["status"] == "skipped":
            continue
        cov = s["trace_coverage"]
        assert cov["exactly_one"] == cov["requests"] > 0, s["name"]
        assert s["follow_up"]["text_sha256"] == doc["baseline"]["text_sha256"]
        assert s["follow_up"]["server"]["output_hash"] == doc["baseline"]["server"]["output_hash"]
    s = by_name(doc)
    assert s["cancel_disconnect"]["terminal_reasons"] == {"cancelled": 1, "completed_length": 1, "disconnected": 2}
    invalid = s["invalid_requests"]
    assert invalid["terminal_reasons"] == {"completed_length": 1, "rejected": 17}
    assert {r["label"]: r["server"]["http_status"] for r in invalid["requests"]}["unknown_model"] == 404
    overload = s["overload_active_cap"]
    assert overload["maxima"]["active_set"]["trace"] == 2 and overload["maxima"]["pending_queue"]["trace"] >= 1
    assert overload["terminal_reasons"]["rejected"] >= 1
    assert s["drain"]["facts"]["exit_code"] == 0
    forced = s["double_sigterm"]
    assert forced["facts"]["exit_code"] not in (None, 0) and forced["facts"]["running_at_second_sigterm"] >= 1
    assert forced["outcomes"].get("error_chunk", 0) >= 1
    stall = s["loop_stall_huge_prompts"]
    assert stall["terminal_reasons"] == {"completed_length": 1, "rejected": 8}
    assert stall["facts"]["burst_gap_ms"] < stall["facts"]["baseline_gap_ms"] + 200
    assert doc["checks"][-1]["name"] == "final_idle" and doc["checks"][-1]["status"] == "pass"


def test_spawn_local_every_applicable_scenario(tmp_path, tiny_model_dir):
    code, doc = run(tmp_path, "--spawn", "--model", str(tiny_model_dir), "--work-dir", str(tmp_path / "work"),
                    "--allow-skips")  # the three rank scenarios need ep >= 2
    assert code == 0, failures(doc)
    assert doc["summary"]["checks"]["skipped"] == 0 and len(doc["summary"]["skips"]) == 3
    assert doc["target"]["backend"] == "local" and doc["target"]["maturity"] == "production"
    assert doc["summary"]["passed"] == [n for n, s in SCENARIOS.items() if s.min_ep_size == 1]
    assert {"expert_rank_failure", "idle_rank_death", "idle_rank_stall"} <= set(doc["summary"]["skipped"])
    assert_common(doc)
    assert all(d["ended_by"] in ("runner_sigterm", "scenario") for d in doc["daemons"])
    assert {"name": "no_tracebacks", "status": "pass"}.items() <= _check(doc, "no_tracebacks").items()


def test_spawn_host_staged_ep2_with_drain_and_a_killed_expert_rank(tmp_path, tiny_model_dir):
    code, doc = run(tmp_path, "--spawn", "--model", str(tiny_model_dir), "--backend", "host-staged",
                    "--ep-size", "2", "--work-dir", str(tmp_path / "work"))
    assert code == 0, failures(doc)
    assert doc["summary"]["passed"] == list(SCENARIOS) and doc["summary"]["skips"] == []
    assert_common(doc)
    erf = by_name(doc)["expert_rank_failure"]
    assert erf["terminal_reasons"] == {"failed": 2}
    assert erf["facts"]["exit_code"] not in (None, 0) and erf["facts"]["killed_rank"] == 1
    assert erf["facts"]["first_503_s"] >= erf["facts"]["kill_s"]
    for r in erf["requests"]:
        assert r["outcome"] == "error_chunk" and r["error"]["code"] == "engine_failed" and r["done"]
        assert r["end_s"] - erf["facts"]["kill_s"] < 15
    assert erf["server"]["restarted_for_follow_up"] is not None
    death, stall = by_name(doc)["idle_rank_death"]["facts"], by_name(doc)["idle_rank_stall"]["facts"]
    assert death["ready_503_after_s"] < 1.0 and death["exit_code"] == 1
    assert stall["ready_503_after_s"] <= stall["rank_timeout_s"] + 0.5 and stall["exit_code"] == 1
    assert _check(doc, "no_tracebacks")["status"] == "pass"  # a killed rank and a stalled one leave no traceback


def _check(doc: dict, name: str) -> dict:
    return next(c for c in doc["checks"] if c["name"] == name)


def test_url_mode_joins_the_given_trace_file_and_skips_what_ends_the_server(tmp_path, tiny_model_dir):
    trace = tmp_path / "trace.jsonl"
    with DaemonProcess("--model", str(tiny_model_dir), "--trace-file", str(trace), "--max-active", "4",
                       "--max-pending", "4", "--max-model-len", "512") as d:
        code, doc = run(tmp_path, "--url", d.url, "--trace-file", str(trace),
                        "--scenarios", "cancel_disconnect,invalid_requests,drain")
        assert code == 1 and doc["summary"]["verdict"] == "incomplete" and not doc["summary"]["failed"], failures(doc)
        assert doc["mode"] == "url" and doc["trace_files"] == [str(trace)] and doc["daemons"] == []
        assert "needs --spawn" in doc["summary"]["skipped"]["drain"] and doc["summary"]["checks"]["skipped"] == 0
        assert by_name(doc)["invalid_requests"]["trace_coverage"]["exactly_one"] == 19  # 17 refusals + the neighbour + the follow-up
        code, doc = run(tmp_path, "--url", d.url, "--scenarios", "invalid_requests")  # no trace file
        checks = {c["name"]: c["status"] for c in by_name(doc)["invalid_requests"]["checks"]}
        assert checks["trace_coverage"] == "skip" and checks["client_outcomes"] == "pass"
        # trace rules skipped: INCOMPLETE, not PASS, unless the skips are accepted
        assert code == 1 and doc["summary"]["verdict"] == "incomplete", failures(doc)
        assert doc["summary"]["checks"]["skipped"] == 3 and not doc["summary"]["failed"]
        code, doc = run(tmp_path, "--url", d.url, "--scenarios", "invalid_requests", "--allow-skips")
        assert code == 0 and doc["summary"]["verdict"] == "pass", failures(doc)


def test_url_mode_against_a_server_with_an_api_key(tmp_path, tiny_model_dir):
    """--api-key: every request of the run carries the bearer token (the raw-socket disconnect too),
    and neither the artifact nor the recorded command holds it; without it the server is unusable."""
    key = "sk-reliability-test-0123456789"
    trace = tmp_path / "trace.jsonl"
    with DaemonProcess("--model", str(tiny_model_dir), "--trace-file", str(trace), "--max-active", "4",
                       "--max-pending", "4", "--max-model-len", "512", "--api-key", key) as d:
        code, doc = run(tmp_path, "--url", d.url, "--trace-file", str(trace), "--api-key", key,
                        "--scenarios", "cancel_disconnect,connection_burst", "--burst", "64x2")
        assert code == 0 and doc["summary"]["verdict"] == "pass", failures(doc)
        assert key not in (tmp_path / "artifact.json").read_text()
        code, doc = run(tmp_path, "--url", d.url, "--scenarios", "cancel_disconnect")
        assert code != 0 and doc["summary"]["verdict"] != "pass"
    from tools.reliakit.client import use_key
    use_key(None)
