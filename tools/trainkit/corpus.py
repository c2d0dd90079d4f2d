"""The training corpus of tools/train_tiny.py: the Python standard library's own .py sources (code and
docstrings), which every machine with Python has, so training needs no download. Files are taken in
sorted order of their path under the stdlib folder; tests, IDLE, demos and vendored packages are left
out. Licence: the Python Software Foundation License (PSF-2.0), as the interpreter's own LICENSE says.
"""
from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

LICENCE = "PSF-2.0 (Python Software Foundation License Version 2; the CPython standard library's sources)"
# Folders whose files are not the library itself (tests, demos, vendored or generated code).
SKIP_DIRS = frozenset({"test", "tests", "idlelib", "turtledemo", "lib2to3", "site-packages", "dist-packages",
                       "ensurepip", "__pycache__", "__phello__", "config-3"})
HELD_OUT_EVERY = 50  # every 50th file (sorted order) is validation, not training


@dataclass(frozen=True, slots=True)
class Corpus:
    root: Path
    files: tuple[str, ...]  # paths relative to root, sorted
    texts: tuple[str, ...]

    @property
    def sha256(self) -> str:
        """One hash over names and contents: two machines trained on the same corpus iff equal."""
        h = hashlib.sha256()
        for name, text in zip(self.files, self.texts):
            h.update(name.encode() + b"\0" + text.encode() + b"\0")
        return h.hexdigest()

    def split(self) -> tuple[list[str], list[str]]:
        """(training texts, validation texts)."""
        train = [t for i, t in enumerate(self.texts) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
        val = [t for i, t in enumerate(self.texts) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
        return train, val or train[:1]

    def manifest(self) -> dict:
        return {"source": "Python standard library .py files", "root": str(self.root),
                "python": sysconfig.get_python_version(), "licence": LICENCE, "files": list(self.files),
                "file_count": len(self.files), "chars": sum(map(len, self.texts)), "sha256": self.sha256,
                "held_out": f"every {HELD_OUT_EVERY}th file in this order is validation"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def load_corpus(root: Path | None = None, *, max_files: int | None = None, max_chars: int | None = None) -> Corpus:
    """The sorted .py files under root (default: this interpreter's stdlib) that decode as UTF-8,
    optionally capped (a toy corpus for tests) by file count and total characters."""
    root = root or stdlib_root()
    names, texts, chars = [], [], 0
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root)
        if any(part in SKIP_DIRS or part.startswith("config-") for part in rel.parts[:-1]):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip():
            continue
        names.append(rel.as_posix())
        texts.append(text)
        chars += len(text)
        if (max_files is not None and len(names) >= max_files) or (max_chars is not None and chars >= max_chars):
            break
    if not names:
        raise ValueError(f"no readable .py files under {root}")
    return Corpus(root, tuple(names), tuple(texts))
