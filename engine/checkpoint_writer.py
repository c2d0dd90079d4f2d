"""Writing synthetic checkpoints: a preset's config (with overrides), its random weights in
safetensors shards with an index, and a byte-level BPE tokenizer trained on engine/data/corpus.txt,
laid out like the published deepseek-ai/DeepSeek-V2-Lite repository so that every loader (ours,
Hugging Face's) reads it as it would read the real one."""
from __future__ import annotations

import copy
import functools
import json
import math
import os
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as HFTokenizer

from pegainfer.engine.config import ConfigError, ModelConfig
from pegainfer.engine.presets import DTYPES, preset_config, random_tensor
from pegainfer.engine.weights import INDEX_FILE, expected_tensors

# Bump when the bytes this module writes change, so cached models (engine/default_model.py) rebuild.
# 2: tokenizer_config.json carries a chat template.
WRITER_VERSION = 2

CORPUS = Path(__file__).parent / "data" / "corpus.txt"
BOS_TOKEN = "<｜begin▁of▁sentence｜>"
EOS_TOKEN = "<｜end▁of▁sentence｜>"
# DeepSeek-V2-Chat's chat template (its tokenizer_config.json), so that chat completions run on the
# synthetic checkpoints as on the real one.
CHAT_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ 'User: ' + message['content'] + '\\n\\n' }}{% elif message['role'] == 'assistant' %}"
    "{{ 'Assistant: ' + message['content'] + eos_token }}{% elif message['role'] == 'system' %}"
    "{{ message['content'] + '\\n\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ 'Assistant:' }}{% endif %}")
TRAINED_VOCAB = 1000  # BPE tokens learned from the corpus (bytes + merges); the rest are reserved
MIN_VOCAB = 256 + 2  # every byte, BOS, EOS
MAX_SHARD_BYTES = 5 * 2**30
_ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


# ---- config ------------------------------------------------------------------------------------
def checkpoint_config(preset: str, overrides: dict[str, Any] | None = None) -> tuple[dict, ModelConfig]:
    """The config.json dict a checkpoint of `preset` with `overrides` gets, and its parsed form.

    Overrides replace top-level fields whole (rope_scaling included; None writes null). BOS/EOS ids
    come from the tokenizer unless the overrides set them."""
    if overrides is not None and not isinstance(overrides, dict):
        raise ConfigError(f"config overrides must be a JSON object, got {type(overrides).__name__}")
    raw = {**preset_config(preset), **copy.deepcopy(overrides or {})}
    source = f"preset {preset!r}" + (f" with overrides {json.dumps(overrides)}" if overrides else "")
    _check_types(raw, source)
    cfg = ModelConfig.from_dict(raw, source)
    if cfg.vocab_size < MIN_VOCAB:
        raise ConfigError(f"{source}: vocab_size {cfg.vocab_size} is too small: the tokenizer needs at "
                          f"least {MIN_VOCAB} ids (256 byte tokens + BOS + EOS)")
    for key, tokenizer_id in zip(("bos_token_id", "eos_token_id"), special_ids(preset, cfg.vocab_size)):
        if key not in (overrides or {}):
            raw[key] = tokenizer_id
        elif raw[key] is not None and not (_is_int(raw[key]) and 0 <= raw[key] < cfg.vocab_size):
            raise ConfigError(f"{source}: {key} must be null or an id below vocab_size {cfg.vocab_size}")
    return raw, ModelConfig.from_dict(raw, source)


def _check_types(raw: dict, source: str) -> None:
    """Reject values of the wrong kind with a message, before they reach shape arithmetic."""
    def bad(key: str, want: str) -> ConfigError:
        return ConfigError(f"{source}: {key} must be {want}, got {json.dumps(raw.get(key))}")

    for key in ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
                "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                "n_routed_experts", "num_experts_per_tok", "max_position_embeddings", "moe_layer_freq"):
        if key in raw and not (_is_int(raw[key]) and raw[key] > 0):
            raise bad(key, "a positive integer")
    for key in ("first_k_dense_replace", "n_shared_experts"):
        if key in raw and not (_is_int(raw[key]) and raw[key] >= 0):
            raise bad(key, "a non-negative integer")
    for key in ("q_lora_rank", "n_group", "topk_group"):
        if raw.get(key) is not None and not (_is_int(raw[key]) and raw[key] > 0):
            raise bad(key, "a positive integer or null")
    if raw.get("rope_scaling") is not None and not isinstance(raw["rope_scaling"], dict):
        raise bad("rope_scaling", "an object or null")
    if raw.get("torch_dtype") not in _ST_DTYPES:
        raise bad("torch_dtype", f"one of {sorted(_ST_DTYPES)}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# ---- tokenizer ---------------------------------------------------------------------------------
def special_ids(preset: str, vocab_size: int) -> tuple[int, int]:
    """Where BOS/EOS live: the preset's ids when they fit after the trained tokens (lite keeps
    DeepSeek's 100000/100001), else the first two ids after them (as DeepSeek lays them out)."""
    trained = min(TRAINED_VOCAB, vocab_size - 2)
    raw = preset_config(preset)
    bos, eos = raw.get("bos_token_id"), raw.get("eos_token_id")
    if isinstance(bos, int) and isinstance(eos, int) and bos != eos and trained <= min(bos, eos) \
            and max(bos, eos) < vocab_size:
        return bos, eos
    return trained, trained + 1


def train_bpe(lines: Iterable[str], vocab: int) -> str:
    """tokenizer.json text of a byte-level BPE with `vocab` tokens learned from `lines`. The trainer
    has no randomness: the same text comes out in every process for the same lines."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    tok.train_from_iterator(lines, trainer)
    return tok.to_str()


@functools.lru_cache(maxsize=4)
def _trained_bpe(vocab: int) -> str:
    """The BPE of engine/data/corpus.txt (the random presets' tokenizer; the CLI test compares a
    subprocess's write with ours)."""
    return train_bpe(CORPUS.read_text(encoding="utf-8").splitlines(keepends=True), vocab)


def build_tokenizer(vocab_size: int, bos_id: int, eos_id: int, *, bpe: str | None = None) -> HFTokenizer:
    """A tokenizer with exactly vocab_size ids: trained BPE first (`bpe`, a train_bpe() result, else the
    corpus.txt BPE), then BOS/EOS at their ids, every other id a reserved placeholder, so any id the
    model emits has a token to decode to."""
    if vocab_size < MIN_VOCAB:
        raise ConfigError(f"vocab_size {vocab_size} is too small: the tokenizer needs at least {MIN_VOCAB} ids")
    tok = HFTokenizer.from_str(bpe if bpe is not None else _trained_bpe(min(TRAINED_VOCAB, vocab_size - 2)))
    first_free = tok.get_vocab_size()
    if not (first_free <= bos_id < vocab_size and first_free <= eos_id < vocab_size and bos_id != eos_id):
        raise ConfigError(f"BOS/EOS ids {bos_id}/{eos_id} must be distinct and in [{first_free}, {vocab_size})")
    specials = {bos_id: BOS_TOKEN, eos_id: EOS_TOKEN}
    run: list[AddedToken] = []
    # Added tokens take the next free id, so add them in id order, flushing placeholders before
    # each special token (those must go through add_special_tokens to be skipped on decode).
    for i in range(first_free, vocab_size):
        if i in specials:
            tok.add_tokens(run)
            run = []
            tok.add_special_tokens([AddedToken(specials[i], special=True, normalized=False)])
        else:
            run.append(AddedToken(f"<|reserved_{i}|>", special=False, normalized=False))
    tok.add_tokens(run)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B", special_tokens=[(BOS_TOKEN, bos_id)])
    if tok.get_vocab_size() != vocab_size or tok.token_to_id(BOS_TOKEN) != bos_id or tok.token_to_id(EOS_TOKEN) != eos_id:
        raise RuntimeError("tokenizer layout came out wrong (tokenizers library changed how it assigns ids?)")
    return tok


def tokenizer_config(model_max_length: int = 16384, *, chat_template: bool = True) -> dict:
    """DeepSeek-V2-Chat's tokenizer_config.json; chat_template=False leaves the template out (a base
    model's, which serves no chat)."""
    def token(content: str) -> dict:
        return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": False,
                "rstrip": False, "single_word": False}

    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": token(BOS_TOKEN),
              "clean_up_tokenization_spaces": False, "eos_token": token(EOS_TOKEN), "legacy": True,
              "model_max_length": model_max_length, "sp_model_kwargs": {}, "tokenizer_class": "LlamaTokenizerFast",
              "unk_token": None}
    return {**config, "chat_template": CHAT_TEMPLATE} if chat_template else config


# ---- weights -----------------------------------------------------------------------------------
def shard_plan(cfg: ModelConfig) -> list[dict[str, tuple[int, ...]]]:
    """Tensors split into >= 2 shards of contiguous layers (embeddings with the first layers, norm
    and lm_head with the last), each at most about MAX_SHARD_BYTES."""
    itemsize = DTYPES[cfg.torch_dtype].itemsize
    groups: list[dict[str, tuple[int, ...]]] = [{} for _ in range(cfg.num_hidden_layers + 2)]
    for name, shape in expected_tensors(cfg).items():
        if name.startswith("model.layers."):
            groups[int(name.split(".")[2]) + 1][name] = shape
        else:
            groups[0 if "embed_tokens" in name else -1][name] = shape

    def size(g: dict[str, tuple[int, ...]]) -> int:
        return sum(math.prod(s) for s in g.values()) * itemsize

    total = sum(size(g) for g in groups)
    n = min(len(groups), max(2, -(-total // MAX_SHARD_BYTES)))
    shards: list[dict[str, tuple[int, ...]]] = [{}]
    done = 0
    for i, g in enumerate(groups):
        opened = len(shards)
        if shards[-1] and opened < n and (done >= opened * total / n or len(groups) - i <= n - opened):
            shards.append({})
        shards[-1].update(g)
        done += size(g)
    return shards


def _write_shard(path: Path, tensors: dict[str, tuple[int, ...]], cfg: ModelConfig, seed: int) -> int:
    """Stream one safetensors file tensor by tensor (the header is known from the shapes), so memory
    stays at one tensor even for multi-GB shards. No timestamps: bytes depend on inputs only."""
    dtype = DTYPES[cfg.torch_dtype]
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in sorted(tensors):
        nbytes = math.prod(tensors[name]) * dtype.itemsize
        header[name] = {"dtype": _ST_DTYPES[cfg.torch_dtype], "shape": list(tensors[name]),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned, as safetensors itself writes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in sorted(tensors):
            t = random_tensor(name, tensors[name], seed, "cpu", dtype).contiguous()
            f.write(t.view(-1).view(torch.uint8).numpy().data)  # little-endian host, as the format wants
    return offset


# ---- the folder --------------------------------------------------------------------------------
def write_checkpoint(out_dir: str | Path, preset: str, seed: int = 0, overrides: dict | None = None, *,
                     chat_template: bool = True) -> Path:
    """Write a complete checkpoint folder; same arguments give byte-identical files. chat_template:
    whether tokenizer_config.json carries DeepSeek-V2-Chat's chat template.

    The folder is built under a temporary name beside out_dir and renamed into place at the end,
    so a crash never leaves a half-written checkpoint. An existing non-empty out_dir is an error
    (FileExistsError), also when another writer renames its copy in first."""
    raw, cfg = checkpoint_config(preset, overrides)
    return atomic_folder(Path(out_dir), lambda folder: _write_files(folder, preset, raw, cfg, seed, chat_template))


def write_tokenizer(out_dir: str | Path, preset: str) -> Path:
    """Only the tokenizer files of a preset's checkpoint (for serving its random weights unwritten)."""
    _, cfg = checkpoint_config(preset)
    return atomic_folder(Path(out_dir), lambda folder: _write_tokenizer(folder, preset, cfg))


def atomic_folder(out_dir: Path, fill: Callable[[Path], None]) -> Path:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FileExistsError(f"{out_dir} already exists and is not empty")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=out_dir.parent))
    try:
        fill(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the checkpoint is not
        try:
            os.rename(tmp, out_dir)
        except OSError as e:
            raise FileExistsError(f"{out_dir} already exists and is not empty ({e.strerror})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _dump(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")


def _write_tokenizer(folder: Path, preset: str, cfg: ModelConfig, chat_template: bool = True) -> None:
    build_tokenizer(cfg.vocab_size, *special_ids(preset, cfg.vocab_size)).save(str(folder / "tokenizer.json"))
    _dump(folder / "tokenizer_config.json", tokenizer_config(chat_template=chat_template))


def _write_files(folder: Path, preset: str, raw: dict, cfg: ModelConfig, seed: int, chat_template: bool) -> None:
    _write_tokenizer(folder, preset, cfg, chat_template)
    _dump(folder / "config.json", raw)
    _dump(folder / "generation_config.json", {
        "_from_model_config": True, "bos_token_id": raw.get("bos_token_id"), "eos_token_id": raw.get("eos_token_id"),
        "do_sample": True, "temperature": 0.3, "top_p": 0.95, "transformers_version": "4.33.1"})
    shards = shard_plan(cfg)
    weight_map: dict[str, str] = {}
    total = 0
    for k, tensors in enumerate(shards, start=1):
        file = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        total += _write_shard(folder / file, tensors, cfg, seed)
        weight_map.update(dict.fromkeys(tensors, file))
    _dump(folder / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
