from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from pegainfer.engine import checkpoint_writer
from pegainfer.engine.checkpoint_writer import write_checkpoint
from pegainfer.engine.config import ConfigError, ModelConfig
from pegainfer.engine.default_model import ensure_default_model
from pegainfer.engine.tokenizer import Tokenizer
from pegainfer.engine.weights import expected_tensors, load_tensors

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "make_tiny_model.py"
VARIANTS = [
    {},
    {"q_lora_rank": 16},
    {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2},
    {"rope_scaling": None},
    {"torch_dtype": "bfloat16"},
]


def run_tool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def variant(tiny_model_dir: Path, tiny_variant_dir, overrides: dict) -> Path:
    return tiny_variant_dir(overrides) if overrides else tiny_model_dir


# ---- the command line ----------------------------------------------------------------------------
def test_cli_flags_write_a_checkpoint(tmp_path: Path):
    out = tmp_path / "m"
    proc = run_tool("--out", str(out), "--preset", "tiny", "--seed", "3", "--config-overrides", '{"q_lora_rank": 16}')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    config = json.loads((out / "config.json").read_text())
    assert config["q_lora_rank"] == 16 and config["num_hidden_layers"] == 4
    assert files(out) == files(write_checkpoint(tmp_path / "again", "tiny", 3, {"q_lora_rank": 16}))


@pytest.mark.parametrize("overrides, message", [
    ('{"q_lora_rank": 16', "--config-overrides is not valid JSON"),
    ('{"topk_method": "random"}', "topk_method 'random' is not supported"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path: Path, overrides: str, message: str):
    proc = run_tool("--out", str(tmp_path / "m"), "--config-overrides", overrides)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "m").exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, message", [
    (["--config-overrides", "[1, 2]"], "must be a JSON object, got list"),
    (["--config-overrides", '{"vocab_size": 100}'], "vocab_size 100 is too small"),
    (["--config-overrides", '{"hidden_size": "64"}'], 'hidden_size must be a positive integer, got "64"'),
    (["--config-overrides", '{"rope_scaling": [1]}'], "rope_scaling must be an object or null"),
    (["--config-overrides", '{"model_type": "llama"}'], "model_type 'llama' is not supported"),
    (["--config-overrides", '{"n_routed_experts": 6, "n_group": 4, "topk_method": "group_limited_greedy"}'],
     "not divisible by n_group"),
    (["--preset", "huge"], "invalid choice: 'huge'"),
    (["--seed", "x"], "invalid int value"),
])
def test_bad_input_in_process(tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str):
    assert main_exit_code(["--out", str(tmp_path / "m"), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "m").exists()


def test_existing_folder_is_refused(tiny_model_dir: Path, capsys: pytest.CaptureFixture):
    assert main_exit_code(["--out", str(tiny_model_dir)]) == 2
    assert "already exists and is not empty" in capsys.readouterr().err


def main_exit_code(argv: list[str]) -> int:
    spec = importlib.util.spec_from_file_location("make_tiny_model", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    with pytest.raises(SystemExit) as exit_info:
        tool.main(argv)
    return exit_info.value.code


# ---- the folder ----------------------------------------------------------------------------------
def test_same_seed_is_byte_identical_other_seed_differs(tiny_model_dir: Path, tiny_variant_dir, tmp_path: Path):
    first = files(tiny_model_dir)
    assert files(write_checkpoint(tmp_path / "again", "tiny", 0)) == first
    other = files(tiny_variant_dir({}, seed=1))
    shards = [n for n in first if n.endswith(".safetensors")]
    assert all(other[n] != first[n] for n in shards)
    assert other["tokenizer.json"] == first["tokenizer.json"] and other["config.json"] == first["config.json"]


def test_layout_matches_the_published_repository(tiny_model_dir: Path):
    assert set(files(tiny_model_dir)) == {
        "config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
        "tokenizer_config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    gen = json.loads((tiny_model_dir / "generation_config.json").read_text())
    assert gen == {"_from_model_config": True, "bos_token_id": 1000, "eos_token_id": 1001, "do_sample": True,
                   "temperature": 0.3, "top_p": 0.95, "transformers_version": "4.33.1"}
    tok_config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    assert tok_config["tokenizer_class"] == "LlamaTokenizerFast" and tok_config["add_bos_token"] is True


@pytest.mark.parametrize("overrides", [{}, {"torch_dtype": "bfloat16", "num_hidden_layers": 6}])
def test_shards_are_contiguous_layers_and_the_index_agrees(tiny_model_dir, tiny_variant_dir, overrides):
    folder = variant(tiny_model_dir, tiny_variant_dir, overrides)
    cfg = ModelConfig.load(folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    weight_map, expected = index["weight_map"], expected_tensors(cfg)
    assert set(weight_map) == set(expected)
    shard_names = sorted(set(weight_map.values()))
    assert len(shard_names) >= 2
    assert all(re.fullmatch(rf"model-0000{k}-of-0000{len(shard_names)}\.safetensors", n)
               for k, n in enumerate(shard_names, start=1))
    nbytes, last_layer = 0, -1
    for shard in shard_names:
        with safe_open(str(folder / shard), framework="pt") as f:
            assert set(f.keys()) == {n for n, s in weight_map.items() if s == shard}
            assert f.metadata() == {"format": "pt"}  # nothing time-dependent
            for name in f.keys():
                sl = f.get_slice(name)
                assert tuple(sl.get_shape()) == expected[name]
                nbytes += math.prod(expected[name]) * (4 if cfg.torch_dtype == "float32" else 2)
            layers = sorted({int(n.split(".")[2]) for n in f.keys() if n.startswith("model.layers.")})
        assert layers == list(range(last_layer + 1, last_layer + 1 + len(layers)))  # contiguous, in order
        last_layer = layers[-1]
    assert index["metadata"]["total_size"] == nbytes
    assert weight_map["model.embed_tokens.weight"] == shard_names[0] and weight_map["lm_head.weight"] == shard_names[-1]


def test_routed_experts_are_stored_per_expert(tiny_model_dir: Path):
    weight_map = json.loads((tiny_model_dir / "model.safetensors.index.json").read_text())["weight_map"]
    for layer in (1, 2, 3):
        for e in range(8):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                assert f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight" in weight_map
    assert "model.layers.0.mlp.gate_proj.weight" in weight_map and "model.layers.0.mlp.experts.0.up_proj.weight" not in weight_map


def test_overrides_replace_fields_and_bos_eos_follow_the_tokenizer(tiny_variant_dir):
    config = json.loads((tiny_variant_dir({"rope_scaling": None}) / "config.json").read_text())
    assert config["rope_scaling"] is None and (config["bos_token_id"], config["eos_token_id"]) == (1000, 1001)
    small = tiny_variant_dir({"vocab_size": 600})
    config = json.loads((small / "config.json").read_text())
    tok = Tokenizer(small)
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (600, 598, 599) == (600, config["bos_token_id"], config["eos_token_id"])
    pinned = json.loads((tiny_variant_dir({"bos_token_id": 7}) / "config.json").read_text())
    assert (pinned["bos_token_id"], pinned["eos_token_id"]) == (7, 1001)


def test_a_crash_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint_writer, "_write_shard", boom)
    with pytest.raises(OSError, match="disk full"):
        write_checkpoint(tmp_path / "m", "tiny", 0)
    assert list(tmp_path.iterdir()) == []


def test_invalid_overrides_raise_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="num_experts_per_tok exceeds n_routed_experts"):
        write_checkpoint(tmp_path / "m", "tiny", 0, {"num_experts_per_tok": 9})
    assert list(tmp_path.iterdir()) == []


# ---- loaders -------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: ",".join(o) or "tiny")
def test_engine_loader_reads_it(tiny_model_dir, tiny_variant_dir, overrides):
    folder = variant(tiny_model_dir, tiny_variant_dir, overrides)
    cfg = ModelConfig.load(folder)
    tensors, stats = load_tensors(folder, cfg)
    assert set(tensors) == set(expected_tensors(cfg)) and stats.shards == 2


@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: ",".join(o) or "tiny")
def test_hugging_face_loads_it_cleanly(tiny_model_dir, tiny_variant_dir, overrides):
    transformers = pytest.importorskip("transformers")
    folder = variant(tiny_model_dir, tiny_variant_dir, overrides)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert type(model).__name__ == "DeepseekV2ForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert not info["error_msgs"]
    cfg = ModelConfig.load(folder)
    ours, _ = load_tensors(folder, cfg, keep=lambda n: n.startswith("model.layers.1.mlp.experts.") or "embed" in n)
    state = model.state_dict()
    assert torch.equal(state["model.embed_tokens.weight"], ours["model.embed_tokens.weight"])
    fused = state["model.layers.1.mlp.experts.gate_up_proj"][5]  # HF fuses per-expert tensors on load
    per_expert = torch.cat([ours[f"model.layers.1.mlp.experts.5.{p}.weight"] for p in ("gate_proj", "up_proj")])
    assert torch.equal(fused.to(per_expert.dtype), per_expert)
    logits = model(torch.tensor([[cfg.bos_token_id, 65, 66, 67]])).logits
    assert torch.isfinite(logits).all() and logits.shape == (1, 4, cfg.vocab_size)


def test_hugging_face_tokenizer_agrees(tiny_model_dir: Path):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    ours = Tokenizer(tiny_model_dir)
    for text in ("Hello, world!", "山谷尽头的小港 😀 café"):
        assert hf(text).input_ids == ours.encode(text)
        assert hf.decode(ours.encode(text), skip_special_tokens=True) == text


# ---- the embedded default model -----------------------------------------------------------------
def test_default_model_is_written_once_and_races_are_safe(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setenv("PEGAINFER_CACHE_DIR", str(tmp_path / "cache"))
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_default_model())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and len(set(results)) == 1
    path = results[0]
    assert path.parent == tmp_path / "cache" and path.name.startswith("tiny-seed0-")
    assert os.listdir(path.parent) == [path.name]  # no temporary folders left behind
    assert files(path) == files(tiny_model_dir)
    mtime = (path / "config.json").stat().st_mtime_ns
    assert ensure_default_model() == path and (path / "config.json").stat().st_mtime_ns == mtime


def test_default_model_cache_location(tmp_path, monkeypatch):
    from pegainfer.engine.default_model import cache_root

    monkeypatch.delenv("PEGAINFER_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "pegainfer"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "pegainfer"


def test_preset_tokenizer_matches_the_preset_ids(tmp_path, monkeypatch, tiny_model_dir):
    from pegainfer.engine.default_model import ensure_preset_tokenizer
    from pegainfer.engine.presets import PRESETS

    monkeypatch.setenv("PEGAINFER_CACHE_DIR", str(tmp_path))
    folder = ensure_preset_tokenizer("tiny")
    assert sorted(os.listdir(folder)) == ["tokenizer.json", "tokenizer_config.json"]
    assert (folder / "tokenizer.json").read_bytes() == (tiny_model_dir / "tokenizer.json").read_bytes()
    tok = Tokenizer(folder)
    assert (tok.bos_id, tok.eos_id, tok.vocab_size) == (PRESETS["tiny"]["bos_token_id"], PRESETS["tiny"]["eos_token_id"], 1024)
    assert ensure_preset_tokenizer("tiny") == folder


# ---- the chat template -------------------------------------------------------------------------------
def test_the_checkpoints_carry_deepseeks_chat_template_unless_told_not_to(tiny_model_dir, tmp_path: Path):
    from pegainfer.engine.checkpoint_writer import CHAT_TEMPLATE

    assert json.loads((tiny_model_dir / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
    assert "{{ bos_token }}" in CHAT_TEMPLATE and "'Assistant:'" in CHAT_TEMPLATE
    spec = importlib.util.spec_from_file_location("make_tiny_model", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main(["--out", str(tmp_path / "plain"), "--no-chat-template"]) == 0
    plain = files(tmp_path / "plain")
    assert "chat_template" not in json.loads(plain["tokenizer_config.json"])
    assert {n: b for n, b in plain.items() if n != "tokenizer_config.json"} == {
        n: b for n, b in files(tiny_model_dir).items() if n != "tokenizer_config.json"}


def test_a_cached_default_model_from_before_the_template_is_not_reused(tmp_path, monkeypatch):
    """The cache folder's name carries the writer's version: a folder written by version 1 (no
    chat template) is left alone, and the default model is written anew, with its template."""
    from pegainfer.engine import default_model

    monkeypatch.setenv("PEGAINFER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(default_model, "WRITER_VERSION", 1)
    old = tmp_path / default_model.default_model_name()
    old.mkdir()
    (old / "model.safetensors.index.json").write_text("{}")
    (old / "tokenizer_config.json").write_text(json.dumps({"bos_token": "x"}))
    monkeypatch.undo()
    monkeypatch.setenv("PEGAINFER_CACHE_DIR", str(tmp_path))
    current = default_model.ensure_default_model()
    assert current != old and "chat_template" in json.loads((current / "tokenizer_config.json").read_text())
    assert "chat_template" in json.loads((default_model.ensure_preset_tokenizer("tiny") / "tokenizer_config.json")
                                         .read_text())
