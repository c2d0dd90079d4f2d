"""tools/agreement.py: greedy agreement with HF at a working dtype beside HF's own distance from the
float32 reference. On the CPU in float32 every pair must agree exactly (the exactness gate's
claim); a nudged weight must show up in every measure; bad input exits 2 with one line."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from tools.agreement import as_close_as_hf, compare, forced_score

ROOT = Path(__file__).resolve().parents[2]


def run_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "tools/agreement.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def few_cases(tmp_path_factory) -> Path:
    """Three cases of the committed set (one row, four rows, the >256-token prompt) to keep CI short."""
    cases = json.loads((ROOT / "tests/data/cases.json").read_text())["cases"]
    keep = [c for c in cases if c["name"] in ("ascii", "batch4_mixed", "long_prompt")]
    path = tmp_path_factory.mktemp("agreement") / "cases.json"
    path.write_text(json.dumps({"cases": keep}))
    return path


def test_compare_counts_prefix_and_positions():
    ref = [[1, 2, 3, 4], [5, 6, 7, 8]]
    got = compare([[1, 2, 9, 4], [5, 6, 7, 8]], ref)
    assert got["prefix_agreement"] == 6 / 8  # row 0 parts at step 2: 2 + 4 tokens before a divergence
    assert got["position_agreement"] == 7 / 8  # the token after the divergence matches again
    assert got["first_divergence_steps"] == [2, None] and got["rows_equal"] == 1
    assert forced_score([[1, 0, 3, 4], [5, 6, 7, 0]], ref) == {"forced_agreement": 6 / 8, "tokens": 8, "misses": 2}


def test_as_close_as_hf_reads_issue_30s_three_conditions():
    def reading(ours_prefix, hf_prefix, ours_forced, hf_forced):
        pairs = {"ours_vs_reference": {"prefix_agreement": ours_prefix}, "hf_vs_reference": {"prefix_agreement": hf_prefix}}
        forced = {"ours": {"forced_agreement": ours_forced}, "hf": {"forced_agreement": hf_forced}}
        return as_close_as_hf(pairs, forced)
    assert reading(0.84, 0.73, 0.994, 0.992)["met"]
    assert reading(0.73, 0.73, 0.992, 0.992)["met"]  # ties count as as close
    r = reading(0.72, 0.73, 0.994, 0.992)
    assert not r["met"] and not r["prefix"] and r["forced"]
    assert not reading(0.84, 0.73, 0.991, 0.992)["met"]
    assert reading(0.84, 0.73, 0.985, 0.98) == {**reading(0.84, 0.73, 0.985, 0.98), "forced_at_least_0.99": False,
                                                 "met": False}
    assert as_close_as_hf(pairs={}, forced={"hf": None, "ours": {}}) is None


def test_float32_on_cpu_agrees_everywhere(tiny_model_dir, few_cases, tmp_path):
    out = tmp_path / "r.json"
    res = run_tool("--model", str(tiny_model_dir), "--dtype", "float32", "--cases", str(few_cases),
                   "--max-tokens", "12", "--min-agreement", "1.0", "--out", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    r = json.loads(out.read_text())
    assert r["row_count"] == 6 and r["max_tokens"] == 12 and r["dtype"] == r["reference_dtype"] == "float32"
    assert all(p["prefix_agreement"] == 1.0 and p["rows_equal"] == 6 for p in r["pairs"].values())
    assert r["forced"]["ours"] == {"forced_agreement": 1.0, "tokens": 72, "misses": 0}
    assert r["forced"]["hf"] is None  # HF at the working dtype is the reference itself
    assert r["as_close_as_hf"] is None
    assert r["target"] == {"measure": "ours_vs_hf prefix_agreement", "threshold": 0.99, "value": 1.0, "met": True}
    assert all(len(row) == 12 for row in r["tokens"]["ours"])
    assert r["command"].startswith("python tools/agreement.py --model")


def test_a_nudged_weight_fails_the_floor(tiny_model_dir, few_cases, tmp_path):
    bad = tmp_path / "perturbed"
    shutil.copytree(tiny_model_dir, bad)
    index = json.loads((bad / "model.safetensors.index.json").read_text())["weight_map"]
    name = "model.layers.1.self_attn.o_proj.weight"
    tensors = load_file(str(bad / index[name]))
    tensors[name] = tensors[name] * 1.5 + 0.05
    save_file(tensors, str(bad / index[name]), metadata={"format": "pt"})
    out = tmp_path / "r.json"
    res = run_tool("--model", str(tiny_model_dir), "--engine-model", str(bad), "--dtype", "float32",
                   "--cases", str(few_cases), "--max-tokens", "12", "--min-agreement", "0.99", "--out", str(out))
    assert res.returncode == 1, res.stderr[-2000:]
    assert "below --min-agreement 0.99" in res.stderr
    r = json.loads(out.read_text())
    assert r["pairs"]["ours_vs_hf"]["prefix_agreement"] < 0.99 and not r["target"]["met"]
    assert r["forced"]["ours"]["misses"] > 0
    assert r["pairs"]["hf_vs_reference"]["prefix_agreement"] == 1.0


@pytest.mark.parametrize("args, words", [
    (["--preset", "nope"], "unknown preset 'nope'"),
    (["--model", "/nonexistent/ckpt"], "is not a checkpoint folder"),
])
def test_bad_input_is_one_line_and_exit_2(args, words, tmp_path):
    res = run_tool(*args, "--out", str(tmp_path / "r.json"))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agreement: error:") and words in lines[0]
    assert not (tmp_path / "r.json").exists()
