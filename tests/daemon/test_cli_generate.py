"""`pegainfer generate`: the CLI contract, and one clear line plus a non-zero exit for bad input."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pegainfer.daemon.cli", "generate", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_json_output_contract(tiny_model_dir):
    p = run("--model", str(tiny_model_dir), "--prompt", "Hello world", "--max-tokens", "8", "--ignore-eos", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert set(out) >= {"token_ids", "text", "finish_reason", "backend", "maturity"}
    assert len(out["token_ids"]) == 8 and out["finish_reason"] == "length"
    assert (out["backend"], out["maturity"], out["batch_invariant"]) == ("local", "production", True)


def test_the_batch_invariance_opt_out_is_reported(tiny_model_dir):
    p = run("--model", str(tiny_model_dir), "--prompt-ids", "5,6,7", "--max-tokens", "3", "--ignore-eos", "--json",
            "--no-batch-invariant")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["batch_invariant"] is False


def test_prompt_ids_and_embedded_default_model():
    """Without --model the embedded trained model is used: the shipped checkpoint folder."""
    from pegainfer.engine.default_model import trained_model_dir
    a = json.loads(run("--prompt-ids", "5,6,7", "--max-tokens", "6", "--ignore-eos", "--json").stdout)
    b = json.loads(run("--model", str(trained_model_dir()), "--prompt-ids", "5,6,7", "--max-tokens", "6", "--ignore-eos",
                       "--json").stdout)
    assert a["token_ids"] == b["token_ids"] and len(a["token_ids"]) == 6


def test_sampled_generation_is_seeded_and_checked(tiny_model_dir):
    """--temperature (with --top-p/--top-k/--min-p) samples; the same --seed gives the same tokens, and
    a flag outside the API's bounds is one line and a non-zero exit before the model loads."""
    args = ("--model", str(tiny_model_dir), "--prompt", "Hello world", "--max-tokens", "12", "--ignore-eos", "--json")
    greedy = json.loads(run(*args).stdout)["token_ids"]
    sampled = [json.loads(run(*args, "--temperature", "1.5", "--top-k", "50", "--seed", str(s)).stdout)["token_ids"]
               for s in (7, 7, 8)]
    assert sampled[0] == sampled[1] and len(sampled[0]) == 12
    assert sampled[0] != greedy or sampled[2] != greedy
    for flag, value, says in (("--temperature", "3", "temperature"), ("--top-p", "0", "top_p"),
                              ("--min-p", "1.5", "min_p"), ("--seed", "-1" + "0" * 30, "seed"),
                              ("--top-k", "-2", "top_k"), ("--max-tokens", "0", "max_tokens"),
                              ("--max-tokens", "-1", "max_tokens"), ("--prompt-ids", "1,-3", "--prompt-ids")):
        p = run(*args, flag, value)
        _one_line_error(p, says)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr  # a usage error: nothing logged or loaded
    off = [json.loads(run(*args, "--temperature", "1.5", "--seed", "7", *k).stdout)["token_ids"]
           for k in ((), ("--top-k", "0"))]
    assert off[0] == off[1]  # top-k 0 is off, as -1 (and as vLLM takes it)


def _one_line_error(p: subprocess.CompletedProcess, *needles: str) -> None:
    assert p.returncode != 0
    lines = [line for line in p.stderr.splitlines() if line.strip() and not line.startswith("{")]
    assert len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture
def copy_model(tiny_model_dir, tmp_path):
    def make() -> Path:
        d = tmp_path / "model"
        shutil.copytree(tiny_model_dir, d)
        return d
    return make


def test_missing_config_field(copy_model):
    d = copy_model()
    cfg = json.loads((d / "config.json").read_text())
    del cfg["kv_lora_rank"]
    (d / "config.json").write_text(json.dumps(cfg))
    _one_line_error(run("--model", str(d), "--prompt", "hi", "--max-tokens", "2"), "kv_lora_rank")


def test_wrong_model_type(copy_model):
    d = copy_model()
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "llama"
    (d / "config.json").write_text(json.dumps(cfg))
    _one_line_error(run("--model", str(d), "--prompt", "hi", "--max-tokens", "2"), "model_type", "llama")


def test_missing_shard(copy_model):
    d = copy_model()
    shard = sorted(d.glob("model-*.safetensors"))[-1]
    shard.unlink()
    _one_line_error(run("--model", str(d), "--prompt", "hi", "--max-tokens", "2"), shard.name)


def test_misshapen_tensor(copy_model):
    d = copy_model()
    index = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    name = "model.layers.0.self_attn.kv_b_proj.weight"
    shard = d / index[name]
    tensors = load_file(str(shard))
    tensors[name] = tensors[name][:, :-1].contiguous()
    save_file(tensors, str(shard), metadata={"format": "pt"})
    _one_line_error(run("--model", str(d), "--prompt", "hi", "--max-tokens", "2"), name, shard.name, "shape")


def test_prompt_ids_outside_vocabulary(tiny_model_dir):
    _one_line_error(run("--model", str(tiny_model_dir), "--prompt-ids", "1,99999", "--max-tokens", "2"),
                    "99999", "vocabulary")


def test_over_context(tiny_model_dir):
    _one_line_error(run("--model", str(tiny_model_dir), "--prompt", "hi", "--max-tokens", "100000"),
                    "context limit")


def test_bad_prompt_ids_syntax(tiny_model_dir):
    _one_line_error(run("--model", str(tiny_model_dir), "--prompt-ids", "1,x", "--max-tokens", "2"), "--prompt-ids")


def test_local_backend_refuses_ep_size(tiny_model_dir):
    _one_line_error(run("--model", str(tiny_model_dir), "--prompt", "hi", "--max-tokens", "2", "--ep-size", "2"),
                    "--ep-size")


@pytest.mark.parametrize("extra", [[], ["--ep-size", "2"], ["--device", "cuda", "--ep-size", "2"]])
def test_nccl_without_a_gpu_per_rank_exits_with_one_line_naming_host_staged(extra):
    """On a machine without GPUs, --backend nccl is refused before anything loads: exactly one line on
    stderr (no start-up log, no traceback) that names the problem and the way out."""
    p = run("--backend", "nccl", *extra, "--prompt-ids", "5,6", "--max-tokens", "2")
    assert p.returncode == 2 and p.stdout == ""  # refused before anything loads: a usage error
    [line] = p.stderr.strip().splitlines()
    assert line.startswith("pegainfer: error: --backend nccl needs one CUDA GPU per rank"), line
    assert "--backend host-staged" in line


def test_the_test_only_transport_is_refused():
    p = run("--backend", "nccl-over-gloo-test", "--ep-size", "2", "--prompt-ids", "5,6", "--max-tokens", "2")
    assert p.returncode == 2
    [line] = p.stderr.strip().splitlines()
    assert "--backend nccl-over-gloo-test is test-only" in line and "host-staged" in line
