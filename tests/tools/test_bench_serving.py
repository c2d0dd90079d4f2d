"""The serving benchmark's client: against a fake OpenAI SSE server that fails every third request
(each failure mode once: HTTP 500, an error chunk, a stream without [DONE]) and one that never
answers in time; the bearer key sent but never recorded; per-request latencies, the progress bar
and plots from 0; the trace join; and the real client against the real tiny-model daemon."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon_process import DaemonProcess, free_port
from tests.tools.bench_fakes import (  # noqa: F401 - fake_server: the module's fixture
    BODIES, CHUNK_GAP_S, FAIL_DELAY_S, KEY, TOKENS, bench, fake_server)
from tools import bench_serving
from tools.benchkit import steps, traces
from tools.benchkit.workload import PROFILES, make_prompts, parse_levels, requests_per_level

ROOT = Path(__file__).resolve().parents[2]


def test_failures_are_counted_and_kept_out_of_the_averages(fake_server, tmp_path):
    r = bench(tmp_path, "--base-url", fake_server, "--profile", "short", "--model", "flaky", "--concurrency", "1,3",
              "--num-requests", "9", "--warmup", "0", "--max-tokens", "4", "--claim", "fake server")
    assert (r["server"]["backend"], r["server"]["maturity"], r["server"]["gpu"]) == ("fake", "candidate",
                                                                                     "Fake GPU 80GB")
    errors = []
    for lv in r["levels"]:
        m = lv["runs"][0]["metrics"]
        assert (m["num_requests"], m["completed"], m["failed"], m["timed_out"]) == (9, 6, 3, 0)
        assert m["total_output_tokens"] == 6 * TOKENS  # the 99-token usage of failed streams is not counted
        assert m["total_input_tokens"] == 6 * 64
        assert m["p99_e2el_ms"] < FAIL_DELAY_S * 1e3 * 0.8 and m["p99_ttft_ms"] < FAIL_DELAY_S * 1e3 * 0.8
        assert m["median_tpot_ms"] == pytest.approx(CHUNK_GAP_S * 1e3, rel=1.0)
        assert lv["marker"] == "failure" and lv["summary"]["output_throughput"]["marker"] == "failure"
        ids = lv["runs"][0]["request_ids"]
        assert len(ids) == 9 and sum(i is None for i in ids) == 1  # the HTTP 500 carried no id
        errors += lv["runs"][0]["errors"]
    assert any("HTTP 500: engine fell over" in e for e in errors)
    assert any("error chunk: rank 1 failed" in e for e in errors)
    assert any("without data: [DONE]" in e for e in errors)
    md = (tmp_path / "report.md").read_text()
    assert "fake server" in md and "6 / 3 / 0" in md and "--model flaky" in md and "First failures" in md


def test_timeouts_are_failures(fake_server, tmp_path):
    r = bench(tmp_path, "--base-url", fake_server, "--profile", "short", "--model", "slow", "--concurrency", "2",
              "--num-requests", "2", "--warmup", "0", "--timeout", "0.5")
    m = r["levels"][0]["runs"][0]["metrics"]
    assert (m["completed"], m["failed"], m["timed_out"]) == (0, 2, 2)
    assert m["mean_ttft_ms"] is None and m["output_throughput"] == 0
    assert r["levels"][0]["marker"] == "failure"


def test_repeats_give_median_min_max(fake_server, tmp_path):
    r = bench(tmp_path, "--base-url", fake_server, "--profile", "mixed", "--model", "steady", "--concurrency", "2",
              "--num-requests", "4", "--repeats", "3", "--warmup", "1", "--max-tokens", "4")
    lv = r["levels"][0]
    assert len(lv["runs"]) == 3 and r["workload"]["warmup"] == {"requests": 1, "failed": 0, "errors": []}
    s = lv["summary"]["output_throughput"]
    assert s["n"] == 3 and s["min"] <= s["median"] <= s["max"] and s["marker"] in ("stable", "noisy")
    assert all(i and i.startswith("steady-") for run in lv["runs"] for i in run["request_ids"])  # from chunk ids
    # mixed: alternating 64- and 512-word prompts; the fake server reports words as prompt tokens
    assert lv["runs"][0]["metrics"]["total_input_tokens"] == 2 * 64 + 2 * 512


def test_a_server_without_usage_counts_chunks_and_says_so(fake_server, tmp_path):
    r = bench(tmp_path, "--base-url", fake_server, "--profile", "short", "--model", "nousage", "--concurrency", "1",
              "--num-requests", "2", "--warmup", "0")
    m = r["levels"][0]["runs"][0]["metrics"]
    assert (m["completed"], m["total_output_tokens"], m["usage_reported"]) == (2, 2 * TOKENS, False)
    assert "sent no usage chunk" in (tmp_path / "report.md").read_text()


def test_chunks_carrying_unicode_line_separators_parse(fake_server, tmp_path):
    """SSE lines end at CR, LF or CRLF only; JSON may carry U+2028, U+0085 or U+001C raw (orjson does),
    which str.splitlines (and httpx's aiter_lines) would take for line ends, cutting the chunk."""
    r = bench(tmp_path, "--base-url", fake_server, "--profile", "short", "--model", "unicode", "--concurrency", "2",
              "--num-requests", "4", "--warmup", "0")
    m = r["levels"][0]["runs"][0]["metrics"]
    assert (m["completed"], m["failed"], m["total_output_tokens"]) == (4, 0, 4 * TOKENS)


def test_workload_is_fixed_by_the_seed():
    a, b = make_prompts(PROFILES["mixed"], 4, seed=3), make_prompts(PROFILES["mixed"], 6, seed=3)
    assert [p.text for p in a] == [p.text for p in b[:4]]
    assert [len(p.text.split()) for p in a] == [64, 512, 64, 512]
    assert make_prompts(PROFILES["short"], 1, seed=4)[0].text != a[0].text
    assert [p.words for p in make_prompts(PROFILES["long"], 2, 0, words_override=7)] == [7, 7]
    assert requests_per_level(1, None) == 16 and requests_per_level(64, None) == 256
    assert requests_per_level(64, 10) == 10
    assert parse_levels(None) == [1, 4, 8, 16, 32, 64, 128, 256] and parse_levels("1,2") == [1, 2]
    with pytest.raises(ValueError):
        parse_levels("0,4")


def _root_span(rid: str, terminal: str | None, active: int, batch: int) -> dict:
    attrs = [{"key": "gen_ai.response.id", "value": {"stringValue": rid}},
             {"key": "pegainfer.active_set_size_max", "value": {"intValue": str(active)}},
             {"key": "pegainfer.decode_batch_size_max", "value": {"intValue": str(batch)}}]
    if terminal:
        attrs.append({"key": "pegainfer.terminal_reason", "value": {"stringValue": terminal}})
    return {"traceId": "0" * 32, "spanId": "1" * 16, "name": "text_completion tiny", "kind": 2,
            "startTimeUnixNano": "1", "endTimeUnixNano": "2", "attributes": attrs}


def test_trace_join_counts_coverage_and_missing(tmp_path):
    path = tmp_path / "trace.jsonl"
    spans = [_root_span("a", "completed_length", 3, 2), _root_span("b", "failed", 5, 4),
             _root_span("c", None, 9, 9),  # not terminal: does not count
             {**_root_span("d", "completed_length", 7, 7), "name": "engine_step decode"}]
    path.write_text("\n".join(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [s]}]}]}) for s in spans)
                    + "\n{\"truncated")
    found = traces.request_spans(path)
    assert set(found) == {"a", "b"}
    j = traces.join_level(["a", "b", "c", "d", None], found)
    assert (j["traced"], j["missing"], j["coverage"], j["without_id"]) == (2, 2, 0.5, 1)
    assert j["missing_ids"] == ["c", "d"]
    assert (j["active_set_size_max"], j["decode_batch_size_max"]) == (5, 4)
    assert j["terminal_reasons"] == {"completed_length": 1, "failed": 1}


def test_arrival_lag_is_the_span_start_less_the_clients_send(tmp_path):
    path = tmp_path / "trace.jsonl"
    ms, t0 = 1_000_000, 1_700_000_000_000_000_000
    spans = [{**_root_span(rid, "completed_length", 3, 2), "startTimeUnixNano": str(t0 + at * ms)}
             for rid, at in (("a", 12), ("b", 30), ("c", 50))]
    path.write_text("\n".join(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [s]}]}]}) for s in spans) + "\n")
    found = traces.request_spans(path)
    run = {"window_ns": [t0, t0 + 100 * ms],
           "requests": [{"request_id": "a", "sent_ms": 2.0}, {"request_id": "b", "sent_ms": 10.0},
                        {"request_id": "c", "sent_ms": 20.0}, {"request_id": "gone", "sent_ms": 1.0},
                        {"request_id": None, "sent_ms": None}]}
    lag = traces.arrival_lags(run, found)
    assert lag == {"requests": 3, "median_ms": 20.0, "p99_ms": 30.0, "max_ms": 30.0}  # 10, 20 and 30 ms
    assert traces.arrival_lags({"window_ns": [t0, t0], "requests": []}, found) is None


def _step_span(index: int, phase: str, start_ns: int, gpu_s: float, rows: int, prefill: int = 0,
               overlapped: bool = False, dropped: int = 0) -> dict:
    attrs = {"pegainfer.step.index": {"intValue": str(index)}, "pegainfer.step.phase": {"stringValue": phase},
             "pegainfer.step.gpu_s": {"doubleValue": gpu_s}, "pegainfer.step.decode_rows": {"intValue": str(rows)},
             "pegainfer.step.prefill_tokens": {"intValue": str(prefill)},
             "pegainfer.step.overlapped": {"boolValue": overlapped},
             "pegainfer.step.dropped_rows": {"intValue": str(dropped)}}
    return {"traceId": "2" * 32, "spanId": f"{index:016x}", "name": f"engine_step {phase}", "kind": 1,
            "startTimeUnixNano": str(start_ns), "endTimeUnixNano": str(start_ns + 1),
            "attributes": [{"key": k, "value": v} for k, v in attrs.items()]}


def test_step_summary_sums_the_window_by_phase(tmp_path):
    ms = 1_000_000
    spans = [_step_span(1, "prefill", 0, 0.050, 0, prefill=900),  # before the window
             _step_span(2, "mixed", 100 * ms, 0.030, 3, prefill=200),
             _step_span(3, "decode", 140 * ms, 0.008, 4, overlapped=True),
             _step_span(4, "decode", 150 * ms, 0.008, 4, overlapped=True, dropped=1),
             _step_span(5, "decode", 162 * ms, 0.009, 3),
             # step 6's span is missing: 5 -> 7 is no interval
             _step_span(7, "decode", 190 * ms, 0.009, 3),
             _step_span(8, "decode", 300 * ms, 0.009, 3)]  # after the window
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [s]}]}]}) + "\n" for s in spans))
    s = steps.summarise(steps.read_steps(path), 100 * ms, 200 * ms)
    assert s["count"] == {"decode": 4, "mixed": 1, "prefill": 0} and s["steps"] == 5
    assert s["steps_in_trace"] == 5 / 6  # indexes 2..7, step 6 missing
    assert s["device_s"]["decode"] == pytest.approx(0.034) and s["device_s"]["mixed"] == pytest.approx(0.030)
    assert s["covered_s"] == pytest.approx(0.09)  # the last step in the window ends at 190 ms
    assert s["device_busy"] == pytest.approx(0.064 / 0.09)
    assert s["decode_rows_mean"] == pytest.approx(3.5) and s["prefill_tokens"] == 200
    assert s["decode_wall_ms_median"] == pytest.approx(11.0)  # intervals 3->4 (10 ms) and 4->5 (12 ms)
    assert s["decode_gpu_ms_median"] == pytest.approx(8.0)
    assert (s["overlapped"], s["dropped_rows"]) == (2, 1)
    assert "device busy 71.1 %" in steps.line(s) and "the trace covers 0.09 s" in steps.line(s)
    assert steps.line(s).startswith("PARTIAL")  # 0.09 of a 0.1 s window: the file may still be behind
    assert not steps.line(steps.summarise(steps.read_steps(path), 100 * ms, 190 * ms)).startswith("PARTIAL")
    assert steps.main([str(path)]) == 0
    assert steps.main([str(tmp_path / "none.jsonl")]) == 2


def test_unreachable_server_is_an_error(tmp_path):
    assert bench_serving.main(["--base-url", f"http://127.0.0.1:{free_port()}", "--profile", "short",
                               "--out", str(tmp_path / "r.json")]) == 2
    assert not (tmp_path / "r.json").exists()


@pytest.mark.slow
def test_against_the_real_daemon(tiny_model_dir, tmp_path):
    trace = tmp_path / "trace.jsonl"
    out, plots = tmp_path / "bench" / "short.json", tmp_path / "plots"
    # no prefix cache: the profile's prompts share their first page, and the steps' prompt tokens are counted below
    with DaemonProcess("--model", str(tiny_model_dir), "--served-model-name", "tiny", "--trace-file", str(trace),
                       "--no-prefix-caching") as d:
        proc = subprocess.run([sys.executable, "tools/bench_serving.py", "--base-url", d.url, "--profile", "short",
                               "--concurrency", "1,2", "--num-requests", "4", "--max-tokens", "8", "--warmup", "1",
                               "--trace-file", str(trace), "--plot-dir", str(plots), "--claim", "CPU smoke test",
                               "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["report_intent"] == "serving_benchmark" and r["claim"] == "CPU smoke test"
    assert (r["server"]["model"], r["server"]["backend"], r["server"]["maturity"]) == ("tiny", "local", "production")
    assert r["command"].startswith("python tools/bench_serving.py --base-url")
    assert len(r["git"]["sha"] or "") == 40 and r["date"]
    assert [lv["concurrency"] for lv in r["levels"]] == [1, 2]
    for lv in r["levels"]:
        m = lv["runs"][0]["metrics"]
        assert (m["completed"], m["failed"]) == (4, 0) and m["total_output_tokens"] == 32 and m["usage_reported"]
        assert m["total_input_tokens"] > 4 * 64  # real prompt tokens from usage, not words
        assert 0 < m["median_ttft_ms"] <= m["median_e2el_ms"] and m["mean_tpot_ms"] > 0
        t = lv["trace"]
        assert t["coverage"] == 1.0 and t["missing"] == 0 and t["terminal_reasons"] == {"completed_length": 4}
        assert 1 <= t["decode_batch_size_max"] <= lv["concurrency"]
        assert t["backend"] == "local" and t["backend_maturity"] == "production"
        st = lv["runs"][0]["server_steps"]  # the engine steps of the run's window, from the same trace
        assert st["count"]["decode"] >= 7 and st["prefill_tokens"] > 4 * 64 and st["steps_in_trace"] == 1.0
        lag = lv["runs"][0]["arrival_lag"]  # the client's send to the server's request span, same host
        assert lag["requests"] == 4 and 0 <= lag["median_ms"] <= lag["max_ms"] < 5_000
    assert r["levels"][0]["trace"]["active_set_size_max"] == 1
    for name in ("output_throughput", "ttft", "tpot"):
        png = plots / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = out.with_suffix(".md").read_text()
    assert "Engine steps inside each run's window" in md and "Client send to server receipt" in md
    assert "CPU smoke test" in md and "`local` (maturity `production`)" in md and "| 2 | 4 | 4 / 0 / 0 |" in md


def _no_key_anywhere(tmp_path: Path) -> None:
    for f in (tmp_path / "report.json", tmp_path / "report.md"):
        assert KEY not in f.read_text(), f


def test_the_key_is_sent_but_never_recorded(fake_server, tmp_path, monkeypatch):
    common = ["--base-url", fake_server, "--profile", "short", "--model", "secured", "--concurrency", "1",
              "--num-requests", "2", "--warmup", "0"]
    for how in (["--api-key", KEY], [f"--api-key={KEY}"]):
        r = bench(tmp_path, *common, *how)
        assert r["levels"][0]["runs"][0]["metrics"]["completed"] == 2  # the server saw the right key
        assert "REDACTED" in r["command"] and r["auth"] == {"bearer": True, "from": "--api-key"}
        _no_key_anywhere(tmp_path)
    monkeypatch.setenv("PEGAINFER_API_KEY", KEY)
    r = bench(tmp_path, *common)
    assert r["levels"][0]["runs"][0]["metrics"]["completed"] == 2
    assert r["auth"] == {"bearer": True, "from": "PEGAINFER_API_KEY"} and "--api-key" not in r["command"]
    _no_key_anywhere(tmp_path)
    monkeypatch.delenv("PEGAINFER_API_KEY")
    r = bench(tmp_path, *common)  # no key: the server refuses every request, and the report says so
    assert r["levels"][0]["runs"][0]["metrics"]["failed"] == 2 and r["auth"] == {"bearer": False, "from": None}
    with pytest.raises(SystemExit) as e:  # an abbreviation would slip past the redaction of --api-key's value
        bench_serving.parse_args([*common, "--api", KEY, "--out", "x.json"])
    assert e.value.code == 2


def test_every_request_has_its_own_latencies_in_the_json(fake_server, tmp_path):
    r = bench(tmp_path, "--base-url", fake_server, "--profile", "short", "--model", "flaky", "--concurrency", "1",
              "--num-requests", "6", "--warmup", "0", "--max-tokens", "4")
    run = r["levels"][0]["runs"][0]
    reqs = run["requests"]
    assert [x["index"] for x in reqs] == list(range(6)) and [x["request_id"] for x in reqs] == run["request_ids"]
    ok = [x for x in reqs if x["ok"]]
    assert len(ok) == run["metrics"]["completed"] == 4
    for x in ok:
        assert 0 < x["ttft_ms"] <= x["e2el_ms"] and x["output_tokens"] == TOKENS and x["error"] is None
        assert x["tpot_ms"] == pytest.approx((x["e2el_ms"] - x["ttft_ms"]) / (TOKENS - 1), abs=1e-2)
        assert x["itl_ms"]["count"] == TOKENS - 1 and x["itl_ms"]["max"] >= x["itl_ms"]["median"] > 0
    failed = [x for x in reqs if not x["ok"]]
    assert len(failed) == 2 and all(x["error"] for x in failed)
    assert max(x["e2el_ms"] for x in ok) == pytest.approx(max_e2el := run["metrics"]["p99_e2el_ms"], rel=0.05), \
        max_e2el  # the run's p99 is drawn from these same requests


def test_progress_bar_only_where_a_person_watches(fake_server, tmp_path, capsys):
    import io

    from tools.benchkit.progress import Progress, wanted

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert wanted(False, Tty()) and not wanted(True, Tty()) and not wanted(False, io.StringIO())
    out = Tty()
    with Progress(3, enabled=True, file=out) as bar:
        bar.stage("concurrency 4")
        bar.advance(3)
    assert "concurrency 4" in out.getvalue() and "3/3" in out.getvalue()
    with Progress(3, enabled=False, file=(quiet := Tty())) as bar:
        bar.advance(3)
    assert quiet.getvalue() == "" and not bar.active
    bench(tmp_path, "--base-url", fake_server, "--profile", "short", "--model", "steady", "--concurrency", "1",
          "--num-requests", "2", "--warmup", "0", "--no-progress")
    err = capsys.readouterr().err
    assert "req/s" not in err and "bench_serving:" not in err.split("concurrency")[0]


def test_plots_start_at_zero(tmp_path):
    from tools.benchkit.plots import FIGURES, figure, plot_levels
    stat = {"median": 900.0, "min": 880.0, "max": 910.0}  # a narrow range far from 0
    levels = [{"concurrency": c, "summary": {k: dict(stat, median=stat["median"] + c) for _, _, s in FIGURES.values()
                                             for k, _ in s}} for c in (1, 2, 4)]
    for stem in FIGURES:
        bottom, top = figure(levels, stem).axes[0].get_ylim()
        assert bottom == 0 and top >= 910  # the whole error bar still fits
    assert [p.name for p in plot_levels(levels, tmp_path)] == [f"{s}.png" for s in FIGURES]


def test_a_sampling_profile_sets_each_request_by_its_index(fake_server, tmp_path):
    """--sampling mix: of every 10 requests 5 greedy, 3 temperature + top_p, 2 penalties with log-probs,
    each sampled one with its own seed; the report names the profile."""
    BODIES.clear()
    r = bench(tmp_path, "--base-url", fake_server, "--profile", "short", "--model", "steady", "--concurrency", "2",
              "--num-requests", "10", "--warmup", "0", "--sampling", "mix", "--no-progress")
    assert r["workload"]["sampling"]["profile"] == "mix" and "sampling mix" in r["workload"]["summary"]
    assert len(BODIES) == 10
    kinds = sorted(str((b["temperature"], b.get("top_p"), b.get("top_k"), b.get("presence_penalty"),
                        b.get("logprobs"))) for b in BODIES)
    assert kinds == sorted([str((0.0, None, None, None, None))] * 5 + [str((0.7, None, 50, 0.5, 5))] * 2
                           + [str((0.7, 0.9, None, None, None))] * 3)
    seeds = [b["seed"] for b in BODIES if b["temperature"] > 0]
    assert len(set(seeds)) == 5 and all("seed" not in b for b in BODIES if b["temperature"] == 0)
    assert all(b["ignore_eos"] and b["stream"] for b in BODIES)
    with pytest.raises(SystemExit):
        bench_serving.parse_args(["--base-url", fake_server, "--profile", "short", "--sampling", "hot", "--out", "x"])
