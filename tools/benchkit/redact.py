"""Secrets out of every recorded command line: the one helper every tool's report goes through
(hardware.command_line, the reliability artifact, the serving report's server URL), and a scanner
for records already written (docs/benchmarks/).

    python tools/benchkit/redact.py [--fix] PATH...    exit 1 if a recorded secret is found (and not fixed)

What counts as a secret, in a command line or a recorded shell command:
- the value of a flag whose last word is key, token, secret, password (`--api-key K`, `--api-key=K`,
  `--hf-token T`, `--client-secret S`); `--max-tokens 8` or `--key-file F` are not secrets;
- the value of an environment assignment named the same way (`PEGAINFER_API_KEY=K`, `HF_TOKEN=T`);
- an HTTP credential (`Authorization: Bearer T`, `Authorization: Basic B`, `Bearer T`);
- the password in a URL (`http://user:PASS@host`) and secret-named query parameters (`?api_key=K`).
A value that is a shell variable (`$KEY`, `${KEY}`) is not a secret: only its name was recorded."""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

REDACTED = "REDACTED"
SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "pwd", "credential",
                          "credentials"})

_WORDS = re.compile(r"[-_]+")
_ASSIGN = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$", re.S)
_FLAG = re.compile(r"^(?P<flag>--?[A-Za-z][A-Za-z0-9_-]*)(?P<eq>=)?(?P<value>.*)$", re.S)
_AUTH = re.compile(r"(?i)\b(?P<head>authorization\s*[:=]\s*(?:(?:bearer|basic|token)\s+)?|bearer\s+)"
                   r"(?P<value>[^\s'\"]+)")
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^\s/:@'\"]+:)(?P<value>[^\s/@'\"]+)(?=@)", re.I)
_QUERY = re.compile(r"(?P<head>[?&](?P<name>[A-Za-z0-9_.-]+)=)(?P<value>[^\s&#'\"]+)")
# free text (a shell command a person wrote into a record): `--flag VALUE`, `--flag=VALUE`, `NAME=VALUE`
_TEXT_FLAG = re.compile(r"(?P<head>(?<![\w-])--?(?P<name>[A-Za-z][A-Za-z0-9_-]*)(?:=|\s+))"
                        r"(?P<value>'[^']*'|\"[^\"]*\"|[^\s'\"-][^\s;|&)]*)")
_TEXT_ASSIGN = re.compile(r"(?P<head>(?<![\w-])(?P<name>[A-Za-z_][A-Za-z0-9_]*)=)"
                          r"(?P<value>'[^']*'|\"[^\"]*\"|[^\s;|&)]+)")


def is_secret_name(name: str) -> bool:
    """A flag, variable or parameter name whose last word names a secret (case and -/_ ignored)."""
    words = [w for w in _WORDS.split(name.strip("-").lower()) if w]
    return bool(words) and words[-1] in SECRET_WORDS


def _keep(value: str) -> bool:
    """Values that are not secrets even under a secret name: nothing, a shell variable, already redacted."""
    v = value.strip("'\"")
    return v in ("", REDACTED) or v.startswith("$")


def _inline(text: str) -> str:
    """Credentials that can sit inside any one argument or string: HTTP auth, URL passwords, query params."""
    text = _AUTH.sub(lambda m: m["head"] + (m["value"] if _keep(m["value"]) else REDACTED), text)
    text = _URL_PASSWORD.sub(lambda m: m["head"] + REDACTED, text)
    return _QUERY.sub(lambda m: m["head"] + (REDACTED if is_secret_name(m["name"]) and not _keep(m["value"])
                                             else m["value"]), text)


def redact_url(url: str | None) -> str | None:
    return None if url is None else _inline(url)


def redact_argv(argv: list[str]) -> list[str]:
    """argv with the values of secret flags and assignments replaced by REDACTED (both `--flag V` and
    `--flag=V`), and credentials inside any argument redacted. The flag names stay, so that the
    record still says a key was given."""
    out: list[str] = []
    secret_next = False
    for arg in argv:
        if secret_next:
            secret_next = False
            out.append(arg if _keep(arg) else REDACTED)
            continue
        flag = _FLAG.match(arg)
        if flag and is_secret_name(flag["flag"]):
            if flag["eq"]:
                out.append(arg if _keep(flag["value"]) else f"{flag['flag']}={REDACTED}")
            else:
                out.append(arg)
                secret_next = not flag["value"]  # `--api-key K`: the value is the next argument
            continue
        assign = _ASSIGN.match(arg)
        if assign and is_secret_name(assign["name"]) and not _keep(assign["value"]):
            out.append(f"{assign['name']}={REDACTED}")
            continue
        out.append(_inline(arg))
    return out


def redact_text(text: str) -> str:
    """A command line already joined into one string (a person's shell command in a record)."""
    def sub(m: re.Match) -> str:
        return m["head"] + (REDACTED if is_secret_name(m["name"]) and not _keep(m["value"]) else m["value"])

    return _inline(_TEXT_ASSIGN.sub(sub, _TEXT_FLAG.sub(sub, text)))


def redact_tree(value: Any) -> Any:
    """Every string in a JSON value through redact_text."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, list):
        return [redact_tree(v) for v in value]
    if isinstance(value, dict):
        return {k: redact_tree(v) for k, v in value.items()}
    return value


def scan(path: Path, fix: bool = False) -> list[str]:
    """The recorded secrets in one report file (.json strings, or any other text file's lines), as
    'file:line: text' findings; with fix, the file is rewritten with them redacted."""
    text = path.read_text(errors="replace")
    if path.suffix == ".json":
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if doc is not None:
            clean = redact_tree(doc)
            if clean == doc:
                return []
            if fix:
                path.write_text(json.dumps(clean, indent=1, ensure_ascii=False) + "\n")
            return [f"{path}: {s}" for s in _changed_strings(doc, clean)]
    lines = text.split("\n")
    clean_lines = [redact_text(x) for x in lines]
    found = [f"{path}:{n}: {new.strip()[:200]}" for n, (old, new) in enumerate(zip(lines, clean_lines), 1)
             if old != new]
    if found and fix:
        path.write_text("\n".join(clean_lines))
    return found


def _changed_strings(old: Any, new: Any) -> list[str]:
    if isinstance(old, str):
        return [new[:200]] if old != new else []
    if isinstance(old, list):
        return [s for a, b in zip(old, new) for s in _changed_strings(a, b)]
    if isinstance(old, dict):
        return [s for k in old for s in _changed_strings(old[k], new[k])]
    return []


def report_files(paths: list[Path]) -> list[Path]:
    """Recorded reports under the paths: .json, .md and .log files (a folder's README.md is prose
    that names the flags, not a record, and is left out)."""
    out = []
    for p in paths:
        found = sorted(p.rglob("*")) if p.is_dir() else [p]
        out += [f for f in found if f.is_file() and f.suffix in (".json", ".md", ".log")
                and not (p.is_dir() and f.name == "README.md")]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Find (and with --fix, redact) secrets in recorded reports.")
    p.add_argument("paths", nargs="+", type=Path, help="report files or folders (e.g. docs/benchmarks)")
    p.add_argument("--fix", action="store_true", help="rewrite the files with the secrets redacted")
    a = p.parse_args(argv)
    missing = [str(x) for x in a.paths if not x.exists()]
    if missing:
        print(f"redact: error: no such file or folder: {missing[0]}", file=sys.stderr)
        return 2
    found = [f for path in report_files(a.paths) for f in scan(path, fix=a.fix)]
    for f in found:
        print(f, file=sys.stderr)
    if found and not a.fix:
        print(f"redact: {len(found)} recorded secret(s); rerun with --fix to redact them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
