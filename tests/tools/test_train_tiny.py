"""tools/train_tiny.py end to end on a toy budget (a few steps on the first stdlib files): it writes a
checkpoint both loaders read, with the architecture the issue asks for, a loss curve and a training
record; the same seed gives the same bytes; bad input is one line and exit 2."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools import train_tiny
from tools.trainkit.corpus import load_corpus

ROOT = Path(__file__).resolve().parents[2]
TOY = ["--steps", "3", "--batch", "2", "--seq-len", "32", "--max-files", "4", "--threads", "1", "--log-every", "1",
       "--warmup", "2"]


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("train") / "toy"
    assert train_tiny.main(["--out", str(out), *TOY]) == 0
    return out


def test_the_toy_checkpoint_has_the_lite_architecture_and_a_record(toy_run):
    cfg = json.loads((toy_run / "config.json").read_text())
    assert cfg["q_lora_rank"] is None and cfg["rope_scaling"]["type"] == "yarn" and cfg["rope_scaling"]["factor"] == 40
    assert cfg["first_k_dense_replace"] == 1 and cfg["num_hidden_layers"] >= 2
    assert cfg["n_routed_experts"] >= 16 and cfg["num_experts_per_tok"] >= 4 and cfg["n_shared_experts"] == 2
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["vocab_size"]) == (4094, 4095, 4096)
    index = json.loads((toy_run / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.1.mlp.experts.15.down_proj.weight" in index and len(set(index.values())) >= 2
    assert "chat_template" in json.loads((toy_run / "tokenizer_config.json").read_text())
    record = json.loads((toy_run / "training.json").read_text())
    assert record["steps_done"] == 3 and record["stopped_by"] == "steps" and record["seed"] == 0
    assert record["corpus"]["file_count"] == 4 and "PSF" in record["corpus"]["licence"]
    assert record["corpus"]["files"] == sorted(record["corpus"]["files"])
    curve = [json.loads(line) for line in (toy_run / "loss.jsonl").read_text().splitlines()]
    assert [c["step"] for c in curve] == [1, 2, 3] and all(c["loss"] > 0 for c in curve)
    assert "val_loss" in curve[-1] and record["plot"] == "loss.png"
    assert (toy_run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_toy_checkpoint_loads_in_pegainfer_and_in_hf(toy_run):
    from pegainfer.engine.engine import EngineSpec, build_engine
    from pegainfer.engine.generate import generate
    from pegainfer.engine.tokenizer import Tokenizer
    from tools.hf_oracle import hf_greedy, load_hf

    tok = Tokenizer(toy_run)
    prompt = tok.encode("def main(")
    assert prompt[0] == tok.bos_id == 4094
    engine = build_engine(EngineSpec(model_dir=str(toy_run)))
    try:
        [ours] = generate(engine, [prompt], 8, ignore_eos=True)
    finally:
        engine.close()
    hf = load_hf(toy_run, __import__("torch").float32, "cpu")  # raises if any parameter is not the file's
    assert ours.token_ids == hf_greedy(hf, prompt, 8, "cpu")


def test_the_same_seed_gives_the_same_weights(toy_run, tmp_path):
    again = tmp_path / "again"
    assert train_tiny.main(["--out", str(again), *TOY]) == 0
    for shard in sorted(toy_run.glob("*.safetensors")):
        assert (again / shard.name).read_bytes() == shard.read_bytes(), shard.name
    assert (again / "tokenizer.json").read_bytes() == (toy_run / "tokenizer.json").read_bytes()


def test_the_corpus_is_the_sorted_stdlib_without_tests():
    corpus = load_corpus(max_files=40)
    assert list(corpus.files) == sorted(corpus.files) and len(corpus.files) == 40
    assert not any(part in ("test", "idlelib") for f in corpus.files for part in f.split("/")[:-1])
    assert load_corpus(max_files=40).sha256 == corpus.sha256
    train, val = load_corpus(max_files=100).split()
    assert len(val) == 2 and len(train) == 98


@pytest.mark.parametrize("argv,says", [
    (["--steps", "0"], "--steps must be a positive integer"),
    (["--minutes", "nan"], "--minutes must be a positive number"),
    (["--lr", "-1"], "--lr must be a positive number"),
    (["--device", "tpu"], "--device must be cpu or cuda"),
    (["--max-files", "0"], "--max-files must be a positive integer"),
    (["--batch", "x"], "argument --batch: invalid int value"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_input_is_one_line_and_exit_2(argv, says, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train_tiny.main(["--out", str(tmp_path / "x"), *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train_tiny: error: ") and says in err, err


def test_an_existing_folder_is_refused_from_the_command_line(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    p = subprocess.run([sys.executable, "tools/train_tiny.py", "--out", str(tmp_path / "full")], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "already exists and is not empty" in p.stderr
    assert "Traceback" not in p.stderr
