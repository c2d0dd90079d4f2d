"""tools/benchkit/steps.py --slowest: the steps with prompt rows that took the most device time, with
what they held (issue 29: where a loaded server's mixed steps go); --gaps: where the device sat idle."""
from __future__ import annotations

import json

from tools.benchkit import steps


def _span(index: int, phase: str, start_ns: int, gpu_s: float, rows: int, decode: int, prefill: int) -> dict:
    attrs = {"pegainfer.step.index": {"intValue": str(index)}, "pegainfer.step.phase": {"stringValue": phase},
             "pegainfer.step.gpu_s": {"doubleValue": gpu_s}, "pegainfer.step.cpu_s": {"doubleValue": gpu_s + 0.001},
             "pegainfer.step.rows": {"intValue": str(rows)}, "pegainfer.step.decode_rows": {"intValue": str(decode)},
             "pegainfer.step.prefill_tokens": {"intValue": str(prefill)}}
    return {"traceId": "3" * 32, "spanId": f"{index:016x}", "name": f"engine_step {phase}", "kind": 1,
            "startTimeUnixNano": str(start_ns), "endTimeUnixNano": str(start_ns + 1),
            "attributes": [{"key": k, "value": v} for k, v in attrs.items()]}


def test_the_slowest_steps_with_prompt_rows_come_first(tmp_path, capsys):
    ms = 1_000_000
    spans = [_span(1, "prefill", 0, 0.050, 100, 0, 900),
             _span(2, "mixed", 10 * ms, 0.380, 300, 250, 1300),
             _span(3, "decode", 20 * ms, 0.900, 250, 250, 0),  # the slowest step, but no prompt rows
             _span(4, "mixed", 30 * ms, 0.020, 260, 250, 130),
             _span(5, "mixed", 900 * ms, 0.500, 80, 10, 4000)]  # outside the window below
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [s]}]}]}) + "\n" for s in spans))
    got = steps.slowest(steps.read_steps(path), 0, 100 * ms, 2)
    assert [r["index"] for r in got] == [2, 1]
    assert got[0] == {"index": 2, "phase": "mixed", "rows": 300, "decode_rows": 250, "prompt_rows": 50,
                      "prefill_tokens": 1300, "gpu_ms": 380.0, "cpu_ms": 381.0}
    assert steps.slowest(steps.read_steps(path), 0, 100 * ms, 0) == []
    assert steps.main([str(path), "--slowest", "-1"]) == 2
    assert steps.main([str(path), "--slowest", "3"]) == 0
    out = capsys.readouterr().out
    assert "step 5 mixed: 80 rows (10 decode, 70 prompts, 4,000 prompt tokens), device 500.00 ms" in out
    assert out.index("step 5 ") < out.index("step 2 ") < out.index("step 1 ") and "step 3 " not in out


def test_the_idle_gaps_are_the_lead_the_tail_and_the_widest_between_steps(tmp_path, capsys):
    ms = 1_000_000
    spans = [_span(1, "prefill", 5 * ms, 0.004, 10, 0, 900),  # busy 5-9 ms: 5 ms of lead
             _span(2, "decode", 9 * ms, 0.003, 10, 10, 0),  # busy 9-12 ms: no gap
             _span(3, "decode", 20 * ms, 0.010, 10, 10, 0),  # 8 ms idle before it; busy 20-30 ms
             _span(4, "mixed", 31 * ms, 0.004, 12, 10, 40),  # 1 ms before it; busy 31-35 ms
             _span(5, "decode", 30 * ms, 0.001, 10, 10, 0)]  # launched before step 4 was read: no gap
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [s]}]}]}) + "\n" for s in spans))
    got = steps.gaps(steps.read_steps(path), 0, 40 * ms, 2)
    assert got["lead_ms"] == 5.0 and got["tail_ms"] == 5.0  # the last device end is step 4's, at 35 ms
    widest = [(w["after"], w["before"], w["ms"]) for w in got["widest"]]
    assert len(widest) == 2 and widest[0] == (2, 3, 8.0) and widest[1][2] == 0.0
    assert got["idle_ms"] == 5.0 + 5.0 + 8.0  # 30 -> 31 is step 5 (start 30, 1 ms) then step 4
    assert steps.gaps(steps.read_steps(path), 100 * ms, 200 * ms, 3)["widest"] == []
    assert steps.main([str(path), "--gaps", "-1"]) == 2
    assert steps.main([str(path), "--gaps", "2", "--since-ns", "0", "--until-ns", str(40 * ms)]) == 0
    out = capsys.readouterr().out
    assert "idle: lead 5.00 ms, tail 5.00 ms, all 18.00 ms" in out
    assert "8.000 ms after step 2 (decode), before step 3 (decode)" in out
    got = steps.first(steps.read_steps(path), 0, 40 * ms, 2)
    assert got == [{"at_ms": 5.0, "index": 1, "phase": "prefill", "rows": 10, "prompt_rows": 10, "prefill_tokens": 900,
                    "gpu_ms": 4.0},
                   {"at_ms": 9.0, "index": 2, "phase": "decode", "rows": 10, "prompt_rows": 0, "prefill_tokens": 0,
                    "gpu_ms": 3.0}]
    assert steps.main([str(path), "--first", "1", "--since-ns", "0"]) == 0
    assert "+5.0 ms step 1 prefill: 10 rows" in capsys.readouterr().out


def test_a_step_launched_while_its_predecessor_runs_starts_on_the_device_when_that_one_ends(tmp_path):
    ms = 1_000_000
    spans = [_span(1, "decode", 0, 0.010, 10, 10, 0),  # device 0-10 ms
             _span(2, "decode", 2 * ms, 0.010, 10, 10, 0),  # launched at 2 ms: device 10-20 ms
             _span(3, "decode", 25 * ms, 0.010, 10, 10, 0)]  # 5 ms idle before it; device 25-35 ms
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [s]}]}]}) + "\n" for s in spans))
    got = steps.gaps(steps.read_steps(path), 0, 35 * ms, 1)
    assert got["widest"][0]["ms"] == 5.0 and got["idle_ms"] == 5.0 and got["tail_ms"] == 0.0


def test_gaps_skip_stretches_beside_a_missing_step_and_an_empty_window_prints_a_line(tmp_path, capsys):
    ms = 1_000_000
    spans = [_span(1, "decode", 0, 0.010, 10, 10, 0),
             _span(3, "decode", 30 * ms, 0.010, 10, 10, 0),  # step 2 is not in the file: 10-30 ms unknown
             _span(4, "decode", 45 * ms, 0.010, 10, 10, 0)]  # 5 ms idle before it
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [s]}]}]}) + "\n" for s in spans))
    got = steps.gaps(steps.read_steps(path), 0, 55 * ms, 4)
    assert got["unknown"] == 1 and got["idle_ms"] == 5.0 and [w["after"] for w in got["widest"]] == [3]
    assert steps.main([str(path), "--gaps", "2", "--since-ns", "0", "--until-ns", str(55 * ms)]) == 0
    assert "(1 stretches beside a step missing from the file not counted)" in capsys.readouterr().out
    late = [str(path), "--gaps", "2", "--first", "3", "--since-ns", str(100 * ms), "--until-ns", str(200 * ms)]
    assert steps.main(late) == 0
    assert "idle: no step started inside the window" in capsys.readouterr().out
