"""The correctness gate: HF transformers vs pegainfer on the committed case set, for the tiny model
and each config variant; and proof the gate fails when it should."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tools.hf_oracle import VARIANTS, GateError, run_gate

ROOT = Path(__file__).resolve().parents[2]


def test_case_set_covers_what_the_gate_promises():
    cases = json.loads((ROOT / "tests/data/cases.json").read_text())["cases"]
    names = {c["name"] for c in cases}
    assert len(cases) >= 5 and all(c["max_tokens"] >= 16 for c in cases)
    assert {"ascii", "utf8_cjk_emoji", "long_prompt", "single_token"} <= names
    sizes = {len(c.get("prompts") or c.get("prompt_ids")) for c in cases}
    assert {1, 4, 8} <= sizes


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gate_is_token_and_text_exact(variant, tiny_variant_dir):
    report = run_gate(tiny_variant_dir(VARIANTS[variant]))
    assert report["classification"] == "all_token_text_exact", report["first_divergence"]
    assert report["report_intent"] == "correctness"
    assert report["case_count"] >= 5 and report["row_count"] >= 14
    assert report["token_agreement"] == 1.0
    assert (report["backend"], report["maturity"]) == ("local", "production")
    assert len(report["checkpoint_hash"]) == 64 and len(report["token_hash"]) == 64
    long_rows = [r for c in report["cases"] if c["name"] == "long_prompt" for r in c["rows"]]
    assert long_rows[0]["prompt_tokens"] > 256
    if variant == "norm_topk_prob":
        assert report["oracle_patches"]


def test_gate_fails_on_a_perturbed_weight(tiny_model_dir, tmp_path):
    """pegainfer loads a copy with one expert weight nudged; HF loads the original: divergence."""
    bad = tmp_path / "perturbed"
    shutil.copytree(tiny_model_dir, bad)
    index = json.loads((bad / "model.safetensors.index.json").read_text())["weight_map"]
    name = "model.layers.1.mlp.experts.3.down_proj.weight"
    shard = bad / index[name]
    tensors = load_file(str(shard))
    tensors[name] = tensors[name] * 1.5 + 0.05
    save_file(tensors, str(shard), metadata={"format": "pt"})
    report = run_gate(tiny_model_dir, engine_dir=bad)
    assert report["classification"] == "divergence"
    div = report["first_divergence"]
    assert div["hf_token"] != div["pegainfer_token"] and div["step"] is not None
    assert report["token_agreement"] < 1.0


def test_gate_refuses_when_hf_would_reinitialise_a_weight(tiny_model_dir, tmp_path):
    """A checkpoint missing a tensor: HF would silently initialise it, so the gate must refuse."""
    bad = tmp_path / "missing"
    shutil.copytree(tiny_model_dir, bad)
    index_path = bad / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    name = "model.layers.0.self_attn.o_proj.weight"
    shard = bad / index["weight_map"].pop(name)
    tensors = load_file(str(shard))
    del tensors[name]
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index_path.write_text(json.dumps(index))
    with pytest.raises(GateError, match="o_proj"):
        run_gate(bad)


def test_cli_writes_a_report(tiny_model_dir, tmp_path):
    out = tmp_path / "report.json"
    cases = tmp_path / "cases.json"
    full = json.loads((ROOT / "tests/data/cases.json").read_text())
    full["cases"] = full["cases"][:2]
    cases.write_text(json.dumps(full))
    proc = subprocess.run([sys.executable, "tools/hf_oracle.py", "--model", str(tiny_model_dir), "--cases", str(cases),
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["classification"] == "all_token_text_exact" and report["case_count"] == 2
    assert report["command"] == f"python tools/hf_oracle.py --model {tiny_model_dir} --cases {cases} --out {out}"


def test_weights_in_the_engine_are_the_checkpoint(tiny_model_dir):
    """The engine's stacked experts are exactly the per-expert tensors on disk."""
    from pegainfer.engine.engine import EngineSpec, build_engine
    engine = build_engine(EngineSpec(model_dir=str(tiny_model_dir)))
    index = json.loads((tiny_model_dir / "model.safetensors.index.json").read_text())["weight_map"]
    name = "model.layers.2.mlp.experts.5.up_proj.weight"
    on_disk = load_file(str(tiny_model_dir / index[name]))[name]
    w13 = engine.backend.shard.w13[2][5]
    assert torch.equal(w13[on_disk.shape[0]:], on_disk)


@pytest.mark.parametrize("backend,ep_size", [("host-staged", 2), ("host-staged", 4), ("nccl-over-gloo-test", 2)])
def test_gate_passes_across_ep_backends(backend, ep_size, tiny_model_dir, tmp_path):
    """The same HF gate through expert-parallel ranks (nccl's code over gloo on CPU, through the
    test-only transport, which the report names as such)."""
    cases = tmp_path / "cases.json"
    full = json.loads((ROOT / "tests/data/cases.json").read_text())
    full["cases"] = [c for c in full["cases"] if c["name"] in ("ascii", "utf8_cjk_emoji", "batch8_mixed")]
    cases.write_text(json.dumps(full))
    report = run_gate(tiny_model_dir, cases_path=cases, backend=backend, ep_size=ep_size)
    assert report["classification"] == "all_token_text_exact", report["first_divergence"]
    assert report["backend"] == backend and report["ep_size"] == ep_size
    assert report["maturity"] == {"host-staged": "production", "nccl-over-gloo-test": "test-only"}[backend]


@pytest.mark.parametrize("backend,says", [
    ("nccl", "--backend nccl needs one CUDA GPU per rank, but --device cpu is not a GPU; use --backend host-staged"),
    ("nccl-over-gloo-test", "--backend nccl-over-gloo-test is test-only"),
])
def test_the_gate_refuses_a_transport_that_cannot_run_here_in_one_line(backend, says, tmp_path):
    """No report may name a transport that did not move the bytes: nccl on CPU and the test-only
    transport are refused before anything loads, with one line on stderr and no report."""
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "tools/hf_oracle.py", "--variants", "base", "--backend", backend,
                           "--ep-size", "2", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("hf_oracle: error: ") and says in line
    assert not out.exists()
