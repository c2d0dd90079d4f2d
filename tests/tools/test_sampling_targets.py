"""tools/dev/sampling_targets.py, which reads issue 33's GPU run: each profile against greedy, a target
met or MISSED by its own threshold, a level not run said so, and the per-level reports merged."""
from __future__ import annotations

import json

from tools.dev import sampling_targets


def report(levels: dict[int, tuple[float, float]]) -> dict:
    return {"command": "python tools/bench_serving.py ...", "levels": [
        {"concurrency": c, "summary": {"median_tpot_ms": {"median": tpot}, "output_throughput": {"median": tput}}}
        for c, (tpot, tput) in levels.items()]}


def test_targets_are_met_or_missed_by_their_thresholds(tmp_path):
    parts = {"greedy": {1: (2.0, 480.0), 64: (9.0, 7000.0), 256: (20.0, 12000.0)},
             "top-p": {1: (2.06, 470.0)},  # 1.03x: met (at the limit)
             "penalties": {1: (2.1, 460.0)},  # 1.05x: missed
             "logprobs": {1: (2.1, 460.0)},  # 1.05x: met (its limit is 5 %)
             "mix": {64: (9.2, 6700.0)}}  # 0.957x at c=64; c=256 not run
    for name, levels in parts.items():
        (tmp_path / f"serving-{name}.json").write_text(json.dumps(report(levels)))
    lines = sampling_targets.targets(sampling_targets.serving_levels(tmp_path))
    assert [line.rsplit(" ", 1)[-1] for line in lines] == ["met", "MISSED", "met", "met", "run"]
    assert lines[-1] == "c=256 mix tok/s >= 0.95x greedy: not run"


def test_merge_keeps_every_level_and_command(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(report({1: (2.0, 480.0)})))
    b.write_text(json.dumps(report({64: (9.0, 7000.0)})))
    out = tmp_path / "serving-greedy.json"
    assert sampling_targets.main(["--merge", str(out), str(a), str(b), str(tmp_path / "missing.json")]) == 0
    merged = json.loads(out.read_text())
    assert [lv["concurrency"] for lv in merged["levels"]] == [1, 64] and len(merged["commands"]) == 2
    assert sampling_targets.serving_levels(tmp_path)["greedy"] == {1: (2.0, 480.0), 64: (9.0, 7000.0)}
