"""Secrets never reach a recorded command line: the shared redaction helper on argv and on free
text (flags, env assignments, bearer headers, URL passwords), the tools that record a command
line through it, the scanner and its --fix, and docs/benchmarks/ holding no recorded secret."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tools.benchkit import hardware
from tools.benchkit.redact import REDACTED, is_secret_name, main, redact_argv, redact_text, redact_url, scan

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-live-0123456789abcdef"


@pytest.mark.parametrize("name, secret", [
    ("--api-key", True), ("--api_key", True), ("--apikey", True), ("--hf-token", True), ("--token", True),
    ("--client-secret", True), ("--db-password", True), ("PEGAINFER_API_KEY", True), ("HF_TOKEN", True),
    ("AWS_SECRET_ACCESS_KEY", True), ("api_key", True),
    ("--max-tokens", False), ("--new-tokens", False), ("--max-prefill-tokens", False), ("--one-token-up-n", False),
    ("--key-file", False), ("--model", False), ("PEGAINFER_GIT_SHA", False)])
def test_which_names_are_secret(name, secret):
    assert is_secret_name(name) is secret


def test_argv_forms():
    argv = ["--base-url", f"http://bench:{SECRET}@host:8000/?api_key={SECRET}&n=2", "--api-key", SECRET,
            f"--api-key={SECRET}", "--max-tokens", "8", f"PEGAINFER_API_KEY={SECRET}", "-H",
            f"Authorization: Bearer {SECRET}", "--hf-token", "$HF_TOKEN", "--claim", "basic run, 8 tokens"]
    out = redact_argv(argv)
    assert SECRET not in " ".join(out)
    assert out == ["--base-url", f"http://bench:{REDACTED}@host:8000/?api_key={REDACTED}&n=2", "--api-key", REDACTED,
                   f"--api-key={REDACTED}", "--max-tokens", "8", f"PEGAINFER_API_KEY={REDACTED}", "-H",
                   f"Authorization: Bearer {REDACTED}", "--hf-token", "$HF_TOKEN", "--claim", "basic run, 8 tokens"]
    assert redact_argv(["--api-key"]) == ["--api-key"]  # a dangling flag: nothing to hide, nothing lost
    assert redact_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000" and redact_url(None) is None


def test_free_text_commands():
    text = (f"PEGAINFER_API_KEY={SECRET} python3 tools/bench_serving.py --api-key {SECRET} --api-key='{SECRET}' "
            f"--new-tokens 24 --one-token-up-n 64 -H \"Authorization: Bearer {SECRET}\" --token $TOK; echo done")
    out = redact_text(text)
    assert SECRET not in out
    assert "--new-tokens 24 --one-token-up-n 64" in out and "--token $TOK; echo done" in out
    assert out.startswith(f"PEGAINFER_API_KEY={REDACTED} python3") and f"--api-key {REDACTED} " in out


def test_every_tool_records_its_command_through_the_helper():
    line = hardware.command_line("tools/bench_serving.py", ["--base-url", "http://h", "--api-key", SECRET])
    assert SECRET not in line and shlex.split(line)[-2:] == ["--api-key", REDACTED]
    assigned = re.compile(r'"command"\]?\s*[:=](?!\s*\{)')  # a report's "command" set (not the schema's)
    lines = [(p, line) for p in (ROOT / "tools").rglob("*.py") for line in p.read_text().splitlines()
             if assigned.search(line)]
    assert len({p for p, _ in lines}) >= 6, lines  # bench_serving, bench_direct, reliability, agreement, hf_oracle...
    for p, line in lines:  # each writes its command through hardware.command_line (which redacts)
        assert "hardware.command_line(" in line, (p, line)


def test_reliability_artifact_redacts_its_command_and_url(tmp_path):
    from tools import reliability
    out = tmp_path / "a.json"
    url = f"http://gate:{SECRET}@127.0.0.1:9"
    assert reliability.main(["--dry-run", "--url", url, "--scenarios", "invalid_requests", "--out", str(out)]) == 0
    text = out.read_text()
    doc = json.loads(text)
    assert SECRET not in text and doc["requested"]["url"] == f"http://gate:{REDACTED}@127.0.0.1:9"


def test_scanner_finds_and_fixes_recorded_secrets(tmp_path, capsys):
    report = tmp_path / "bench.json"
    report.write_text(json.dumps({"command": f"python tools/bench_serving.py --api-key {SECRET}", "n": 1,
                                  "levels": [{"note": f"PEGAINFER_API_KEY={SECRET}"}]}))
    md = tmp_path / "bench.md"
    md.write_text(f"# x\n\n- Command: `python tools/bench_serving.py --api-key={SECRET}`\n- Date: now\n")
    (tmp_path / "README.md").write_text("| `--api-key KEY` | `Authorization: Bearer KEY` |\n")  # prose, not a record
    clean = tmp_path / "clean.json"
    clean.write_text(json.dumps({"command": "python tools/bench_direct.py --new-tokens 24"}))
    assert len(scan(report)) == 2 and len(scan(md)) == 1 and scan(clean) == []
    assert main([str(tmp_path)]) == 1
    assert "recorded secret" in capsys.readouterr().err and SECRET in report.read_text()  # found, not changed
    assert main(["--fix", str(tmp_path)]) == 0
    assert SECRET not in report.read_text() + md.read_text()
    assert json.loads(report.read_text())["n"] == 1 and "- Date: now" in md.read_text()
    assert main([str(tmp_path)]) == 0
    assert main([str(tmp_path / "missing")]) == 2


def test_docs_benchmarks_hold_no_recorded_secret():
    assert main([str(ROOT / "docs" / "benchmarks")]) == 0
