"""The direct benchmark on the tiny model, CPU: a complete report with HF side by side (same tokens
from the same weights, for a checkpoint folder and for a random preset) and phase attribution;
the timed loop generates what engine.generate does; a weight mismatch shows in the comparison."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.generate import generate
from pegainfer.engine.kernels.config import KernelConfig
from tools import bench_direct
from tools.benchkit import hf_side
from tools.benchkit.direct import batch_prompts, run_ours, synchronizer, token_hash

ROOT = Path(__file__).resolve().parents[2]
PHASES = {"attention", "routing", "experts", "combine", "shared_experts", "dense_mlp", "lm_head", "sampling"}


def test_report_with_hf_and_attribution(tiny_model_dir, tmp_path):
    out = tmp_path / "direct.json"
    assert bench_direct.main(["--model", str(tiny_model_dir), "--device", "cpu", "--batches", "1,2",
                              "--prompt-len", "8", "--new-tokens", "5", "--warmup", "1", "--iters", "2",
                              "--compare-hf", "--attribution", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["report_intent"] == "direct_diagnostic"
    assert (r["backend"], r["maturity"]) == ("local", "production")
    assert r["command"].startswith("python tools/bench_direct.py --model")
    assert r["stack"]["torch"] == torch.__version__ and r["stack"]["transformers"]
    assert len(r["git"]["sha"] or "") == 40 and r["date"] and r["host"]["cpu"]
    assert [b["batch"] for b in r["batches"]] == [1, 2]
    for b in r["batches"]:
        assert b["decode_steps"] == 2 * 4 and b["deterministic"]
        assert b["prefill_ms_median"] > 0 and 0 < b["tpot_ms_p50"] and b["tpot_ms_mean"] > 0
        assert b["decode_tok_s"] == pytest.approx(b["batch"] / (b["tpot_ms_mean"] / 1e3))
        assert len(b["token_hash"]) == 64
        assert b["hf"]["tokens_match"], "HF with the same weights should generate the same greedy tokens"
        assert b["hf"]["decode_steps"] == 8 and b["hf_over_ours_tpot"] > 0
        att = b["attribution"]
        assert PHASES <= set(att["phases"]) and att["steps"] == 4
        calls = {k: v["calls_per_step"] for k, v in att["phases"].items()}
        assert calls["attention"] == 4 and calls["routing"] == 3 and calls["dense_mlp"] == 1 and calls["lm_head"] == 1
        assert all(p["cpu_ms_per_step"] > 0 for p in att["phases"].values())
        assert att["phases"]["attention"]["device_ms_per_step"] is None  # CPU run: no device time claimed
    assert r["hf_setup"]["how"].startswith("from_pretrained")
    md = out.with_suffix(".md").read_text()
    assert r["workload"]["async_scheduling"] is True and "overlapped as the daemon's --async-scheduling" in md
    assert "direct_diagnostic" in md and "| 2 |" in md and "Attribution, batch 2" in md and "shared_experts" in md


def test_preset_cli_builds_hf_with_our_random_weights(tmp_path):
    """The fused-expert copy is right: HF with the preset's tensors generates our tokens."""
    out = tmp_path / "preset.json"
    proc = subprocess.run([sys.executable, "tools/bench_direct.py", "--preset", "tiny", "--device", "cpu",
                           "--batches", "3", "--prompt-len", "6", "--new-tokens", "4", "--warmup", "0", "--iters", "1",
                           "--compare-hf", "--no-async-scheduling", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    (b,) = r["batches"]
    assert b["hf"]["tokens_match"] and "attribution" not in b
    assert r["engine"]["model"] == "random preset tiny (seed 0)"
    assert "our random tensors copied in" in r["hf_setup"]["how"]
    assert r["workload"]["async_scheduling"] is False
    assert "each timed wall-clock with a device synchronize" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize("overlap", [False, True], ids=["step-by-step", "async-scheduling"])
def test_timed_loop_generates_what_generate_does(tiny_model_dir, overlap):
    engine = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=3))
    prompts = batch_prompts(engine.cfg.vocab_size, [engine.cfg.bos_token_id, engine.cfg.eos_token_id], 7, 1, 3,
                            distinct=True)
    assert max(max(p) for p in prompts) < engine.cfg.bos_token_id
    assert len({tuple(p) for p in prompts}) == 3  # a prompt per row
    timed = run_ours(engine, prompts, 6, synchronizer("cpu"), overlap)
    ref = [g.token_ids for g in generate(engine, prompts, 6, ignore_eos=True)]
    engine.close()
    assert timed.tokens == ref and len(timed.step_s) == 5
    assert token_hash(timed.tokens) == token_hash(ref) != token_hash([ref[0]])
    same = batch_prompts(1024, [1000], 7, 1, 3, distinct=False)
    assert same[0] == same[2] == prompts[0]


def test_other_weights_do_not_match():
    """The comparison can fail: HF from another seed generates other tokens."""
    engine = build_engine(EngineSpec(random_preset="tiny", seed=0, num_slots=2))
    prompts = batch_prompts(engine.cfg.vocab_size, [engine.cfg.bos_token_id], 6, 0, 2, distinct=True)
    ours = run_ours(engine, prompts, 6, synchronizer("cpu")).tokens
    engine.close()
    same, _ = hf_side.from_preset("tiny", 0, torch.float32, "cpu")
    other, _ = hf_side.from_preset("tiny", 1, torch.float32, "cpu")
    sync = synchronizer("cpu")
    assert hf_side.generate_timed(same, prompts, 6, "cpu", sync).tokens == ours
    assert hf_side.generate_timed(other, prompts, 6, "cpu", sync).tokens != ours


def test_a_tensor_hf_has_no_home_for_is_refused():
    params = {"model.norm.weight": torch.zeros(4)}
    with pytest.raises(hf_side.HFSideError, match="no parameter"):
        hf_side._target(params, "model.layers.0.mlp.bogus.weight")
    fused = {"model.layers.1.mlp.experts.gate_up_proj": torch.zeros(2, 6, 4)}
    name, view = hf_side._target(fused, "model.layers.1.mlp.experts.1.up_proj.weight")
    assert name == "model.layers.1.mlp.experts.gate_up_proj" and view.shape == (3, 4)
    view.fill_(1)
    assert fused[name][1, 3:].sum() == 12 and fused[name][1, :3].sum() == 0 and fused[name][0].sum() == 0


@pytest.mark.parametrize("backend, says", [("nccl", "needs one CUDA GPU per rank"),
                                           ("nccl-over-gloo-test", "is test-only")])
def test_a_transport_that_cannot_run_here_is_refused_before_loading(backend, says, tmp_path, capsys):
    """A bench report names the transport that moved its bytes: nccl on CPU, or the test-only
    transport, is refused with one line before anything loads, and no report is written."""
    out = tmp_path / "direct.json"
    assert bench_direct.main(["--preset", "tiny", "--device", "cpu", "--backend", backend, "--ep-size", "2",
                              "--out", str(out)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("bench_direct: error: ") and says in line and "host-staged" in line
    assert not out.exists()


def test_sampling_profiles_run_each_row_with_its_parameters(tiny_model_dir, tmp_path):
    """--sampling mix on the CPU (host-sampled steps, one at a time): seeded, so the same tokens on
    every iteration, and not the greedy ones; the report names the profile. --compare-hf (greedy
    only) refuses a sampled profile."""
    common = ["--model", str(tiny_model_dir), "--device", "cpu", "--batches", "10", "--prompt-len", "6",
              "--new-tokens", "6", "--warmup", "0", "--iters", "2"]
    out = tmp_path / "profiles.json"
    assert bench_direct.main([*common, "--sampling", "greedy,mix", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert [p["profile"] for p in r["workload"]["sampling"]] == ["greedy", "mix"] and r["workload"]["greedy"] is False
    greedy, mix = r["batches"]
    assert (greedy["sampling"], mix["sampling"]) == ("greedy", "mix")
    assert mix["deterministic"] and mix["decode_steps"] == 2 * 5 and mix["token_hash"] != greedy["token_hash"]
    assert "| 10 (mix) |" in out.with_suffix(".md").read_text()
    for bad in (["--sampling", "mix", "--compare-hf"], ["--sampling", "greedy,hot"]):
        with pytest.raises(SystemExit) as e:
            bench_direct.parse_args([*common, *bad, "--out", str(tmp_path / "x.json")])
        assert e.value.code == 2


def test_sample_chunks_sets_the_device_samplers_launch(tmp_path):
    """--sample-chunks: KernelConfig.sample.chunks of the engine it builds (0: one program per row, the
    A/B's other side); absent: the config's default (64, each row split over programs); negative: a
    usage error."""
    common = ["--preset", "tiny", "--device", "cpu", "--out", str(tmp_path / "x.json")]
    default = bench_direct.kernel_config(bench_direct.parse_args(common))
    assert default.sample == KernelConfig().sample and default.sample.chunks == 64
    one = bench_direct.kernel_config(bench_direct.parse_args([*common, "--sample-chunks", "0"]))
    assert one == dataclasses.replace(default, sample=dataclasses.replace(default.sample, chunks=0))
    with pytest.raises(SystemExit) as e:
        bench_direct.parse_args([*common, "--sample-chunks", "-1"])
    assert e.value.code == 2


def test_float32_logits_is_the_default_and_can_be_turned_off(tmp_path):
    """--no-float32-logits: KernelConfig.float32_logits off (logits rounded to the model dtype, the
    A/B's other side); everything else as the default."""
    common = ["--preset", "tiny", "--device", "cpu", "--out", str(tmp_path / "x.json")]
    default = bench_direct.kernel_config(bench_direct.parse_args(common))
    assert default.float32_logits and default == KernelConfig()
    off = bench_direct.kernel_config(bench_direct.parse_args([*common, "--no-float32-logits"]))
    assert off == dataclasses.replace(default, float32_logits=False)
