"""tools/bench_replay.py: bench_serving's workload driven into the daemon's runtime with no HTTP,
reported with the same metric keys, and the HTTP tax against a bench_serving report."""
from __future__ import annotations

import json
import sys

import pytest

from tools import bench_replay
from tools.benchkit.metrics import summarise
from tools.benchkit.replay import http_tax


@pytest.fixture
def restore_interpreter():
    """The runtime tunes the interpreter for serving (switch interval); give the test process its own back."""
    interval = sys.getswitchinterval()
    yield
    sys.setswitchinterval(interval)


@pytest.mark.slow
def test_replays_the_workload_in_process_with_bench_serving_metrics(tiny_model_dir, tmp_path, restore_interpreter):
    trace = tmp_path / "trace.jsonl"
    http_report = tmp_path / "http.json"  # a bench_serving report of the same workload (numbers made up)
    http_report.write_text(json.dumps({"workload": {"profile": "short", "max_tokens": 6, "seed": 0, "num_requests": 5,
                                                    "ignore_eos": True, "sampling": {"profile": "greedy"}}, "levels": [
        {"concurrency": 3, "summary": {"output_throughput": {"median": 50.0}, "median_tpot_ms": {"median": 40.0}}},
        {"concurrency": 64, "summary": {"output_throughput": {"median": 1.0}, "median_tpot_ms": {"median": 1.0}}}]}))
    out = tmp_path / "replay.json"
    code = bench_replay.main(["--profile", "short", "--concurrency", "1,3", "--num-requests", "5", "--max-tokens", "6",
                              "--warmup", "2", "--warmup-concurrency", "2", "--detokenize", "--compare", str(http_report), "--out", str(out), "--",
                              "--model", str(tiny_model_dir), "--served-model-name", "tiny", "--max-active", "2",
                              "--trace-file", str(trace), "--no-prefix-caching"])  # every prompt token computed (below)
    assert code == 0
    r = json.loads(out.read_text())
    assert r["report_intent"] == "serving_replay" and r["engine"]["model"] == "tiny"
    assert r["engine"]["max_active"] == 2 and r["workload"]["detokenize"] is True
    assert r["workload"]["warmup"] == {"requests": 2, "failed": 0}
    assert [lv["concurrency"] for lv in r["levels"]] == [1, 3]
    for lv in r["levels"]:
        m = lv["runs"][0]["metrics"]
        assert set(m) == set(summarise([], 1.0))  # bench_serving's keys, bench_serving's definitions
        assert (m["completed"], m["failed"]) == (5, 0) and m["total_output_tokens"] == 30
        assert m["total_input_tokens"] > 5 * 64  # the real prompt tokens
        assert 0 < m["median_ttft_ms"] <= m["median_e2el_ms"] and m["mean_tpot_ms"] > 0
        steps = lv["runs"][0]["server_steps"]  # the engine's own steps in the run's window
        assert steps["count"]["decode"] >= 5 and steps["prefill_tokens"] > 5 * 64
    # concurrency 3 over 2 KV slots: one request waited, and still finished
    tax = r["http_tax"]
    assert [t["concurrency"] for t in tax] == [3]  # only the level both reports have
    replay_tps = r["levels"][1]["summary"]["output_throughput"]["median"]
    assert tax[0]["throughput_ratio"] == pytest.approx(50.0 / replay_tps)
    assert "HTTP / replay" in out.with_suffix(".md").read_text()


def test_http_tax_is_http_over_replay():
    def level(n, tps, tpot):
        return {"concurrency": n, "summary": {"output_throughput": {"median": tps}, "median_tpot_ms": {"median": tpot}}}
    tax = http_tax([level(64, 1000.0, 10.0), level(256, 2000.0, 20.0)], {"levels": [level(256, 1900.0, 21.0)]})
    assert tax == [{"concurrency": 256, "http_output_throughput": 1900.0, "replay_output_throughput": 2000.0,
                    "throughput_ratio": 0.95, "http_median_tpot_ms": 21.0, "replay_median_tpot_ms": 20.0,
                    "tpot_ratio": 20.0 / 21.0}]
    assert http_tax([level(1, 0.0, None)], {"levels": [level(1, 5.0, 1.0)]})[0]["throughput_ratio"] is None


def test_bad_serve_settings_are_one_line_and_exit_2(tmp_path, capsys):
    code = bench_replay.main(["--profile", "short", "--out", str(tmp_path / "r.json"), "--", "--max-active", "0"])
    assert code == 2 and not (tmp_path / "r.json").exists()
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench_replay: error:") and "\n" not in err


def test_compare_must_exist(tmp_path):
    with pytest.raises(SystemExit) as e:
        bench_replay.main(["--profile", "short", "--compare", str(tmp_path / "none.json"), "--out", str(tmp_path / "r")])
    assert e.value.code == 2


@pytest.mark.parametrize("theirs, says", [
    ({"max_tokens": 16}, "max_tokens: 16 there, 8 here"), ({"num_requests": 4}, "num_requests: 4 there, 2 here"),
    ({"profile": "long"}, "profile: 'long' there, 'short' here"), ({"seed": 3}, "seed: 3 there, 0 here"),
    ({"sampling": {"profile": "mix"}}, "sampling: 'mix' there, greedy here"), (None, "not a bench_serving report"),
])
def test_compare_refuses_another_workload_before_loading(tmp_path, capsys, theirs, says):
    """A ratio between two different workloads means nothing: one line, exit 2, no engine loaded."""
    other = tmp_path / "http.json"
    same = {"profile": "short", "max_tokens": 8, "num_requests": 2, "seed": 0, "ignore_eos": True}
    other.write_text(json.dumps({"levels": []} | ({} if theirs is None else {"workload": same | theirs})))
    code = bench_replay.main(["--profile", "short", "--max-tokens", "8", "--num-requests", "2", "--compare", str(other),
                              "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not (tmp_path / "r.json").exists() and "\n" not in err
    assert err.startswith(f"bench_replay: error: --compare {other} is another workload") and says in err, err
