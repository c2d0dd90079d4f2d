"""The embedded default model: a small DeepSeek-V2 trained on the Python standard library's sources
(tools/train_tiny.py), shipped as package data in engine/data/tiny-stdlib-trained, so that pegainfer
serves recognisable text with no checkpoint and no download. Also the random tiny preset (seed 0) and
the tokenizers of the random presets, written once into a cache folder and reused (tests and
`--random-preset` use those)."""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from pegainfer.engine.checkpoint_writer import CORPUS, WRITER_VERSION, write_checkpoint, write_tokenizer
from pegainfer.engine.presets import PRESETS
from pegainfer.engine.weights import INDEX_FILE

PRESET = "tiny"
SEED = 0
TRAINED = Path(__file__).parent / "data" / "tiny-stdlib-trained"  # `python tools/train_tiny.py`, see its training.json


def cache_root() -> Path:
    """$PEGAINFER_CACHE_DIR, else $XDG_CACHE_HOME/pegainfer, else ~/.cache/pegainfer."""
    if os.environ.get("PEGAINFER_CACHE_DIR"):
        return Path(os.environ["PEGAINFER_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "pegainfer"


def fingerprint(preset: str) -> str:
    """Short hash of everything the written bytes depend on: preset, writer version, corpus."""
    h = hashlib.sha256()
    h.update(json.dumps(PRESETS[preset], sort_keys=True).encode())
    h.update(f"writer-{WRITER_VERSION}".encode())
    h.update(CORPUS.read_bytes())
    return h.hexdigest()[:12]


def preset_names() -> list[str]:
    """The random-weight presets (`--random-preset`)."""
    return list(PRESETS)


def default_model_name() -> str:
    return f"{PRESET}-seed{SEED}-{fingerprint(PRESET)}"


def trained_model_dir() -> Path:
    """The shipped trained checkpoint (what `pegainfer serve` without --model serves)."""
    if not (TRAINED / INDEX_FILE).is_file():
        raise FileNotFoundError(f"{TRAINED}: the embedded trained model is missing from this installation "
                                f"(reinstall pegainfer, or give --model DIR)")
    return TRAINED


def ensure_default_model() -> Path:
    """The random tiny preset's checkpoint folder (seed 0), written on first use."""
    return _ensure(cache_root() / default_model_name(), INDEX_FILE, lambda path: write_checkpoint(path, PRESET, SEED))


def ensure_preset_tokenizer(preset: str) -> Path:
    """A folder with the tokenizer files of `preset`'s checkpoint (BOS/EOS at the preset's ids), for
    serving the preset's random weights without writing them."""
    path = cache_root() / f"{preset}-tokenizer-{fingerprint(preset)}"
    return _ensure(path, "tokenizer.json", lambda p: write_tokenizer(p, preset))


def _ensure(path: Path, marker: str, write: Callable[[Path], Path]) -> Path:
    """Safe when processes race: each writer builds a private temporary folder and renames it into
    place, so a folder that exists is complete; a loser of the rename uses the winner's folder."""
    if not (path / marker).is_file():
        try:
            write(path)
        except FileExistsError:
            if not (path / marker).is_file():
                raise FileExistsError(f"{path} exists but is not a complete folder; delete it "
                                      f"and it will be written again") from None
    return path
